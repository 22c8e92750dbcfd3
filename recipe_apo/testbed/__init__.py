"""The CPU testbed: the recipe's methods trained side by side on a small verifiable task, through verl's own
compute_advantage and registered policy losses (``python -m recipe_apo.testbed``; see conf/testbed.yaml)."""

import sys as _sys

# `python -m recipe_apo.testbed` pins the CPU kernels, which the libraries read only when torch loads: before this
# package's modules load torch (kernels.py; spares the testbed a restart).
if "recipe_apo.testbed" in _sys.orig_argv:
    from recipe_apo.testbed import kernels as _kernels

    _kernels.pin_early()
