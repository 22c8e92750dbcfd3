"""recipe-apo: Adaptive Policy Optimization (APO) for verl.

Importing verl registers APO through the ``verl.plugins`` entry point. Importing ``recipe_apo`` imports verl
first, so that registration always runs from a clean start (the plugin imports this package's modules), and
then registers explicitly, which also covers ``VERL_USE_EXTERNAL_PLUGINS=none``.
"""

import sys as _sys

if "recipe_apo.testbed" in _sys.orig_argv:
    # ``python -m recipe_apo.testbed``: its pinned CPU kernels must be in the environment before verl loads torch
    # (recipe_apo/testbed/kernels.py); setting them here spares the testbed a second start.
    from recipe_apo.testbed import kernels as _kernels

    _kernels.pin_early()

import verl  # noqa: E402,F401  (loads verl's plugins, this package's among them)

from recipe_apo import plugin as _plugin  # noqa: E402,F401

__version__ = "0.1.0"
