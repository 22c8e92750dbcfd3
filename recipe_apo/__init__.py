"""recipe-apo: Adaptive Policy Optimization (APO) for verl.

Importing verl registers APO through the ``verl.plugins`` entry point. Importing ``recipe_apo`` imports verl
first, so that registration always runs from a clean start (the plugin imports this package's modules), and
then registers explicitly, which also covers ``VERL_USE_EXTERNAL_PLUGINS=none``.
"""

import sys as _sys

# The one line of a tool's work here: `python -m recipe_apo.testbed` pins the CPU kernels, which the libraries read
# only when torch loads, and the verl import below loads torch (testbed/kernels.py; spares the testbed a restart).
if "recipe_apo.testbed" in _sys.orig_argv: __import__("recipe_apo.testbed.kernels").testbed.kernels.pin_early()  # noqa: E701

import verl  # noqa: E402,F401  (loads verl's plugins, this package's among them)

from recipe_apo import plugin as _plugin  # noqa: E402,F401

__version__ = "0.1.0"
