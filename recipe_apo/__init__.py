"""recipe-apo: Adaptive Policy Optimization (APO) for verl.

Importing verl registers APO through the ``verl.plugins`` entry point. Importing ``recipe_apo`` imports verl
first, so that registration always runs from a clean start (the plugin imports this package's modules), and
then registers explicitly, which also covers ``VERL_USE_EXTERNAL_PLUGINS=none``.
"""

import verl  # noqa: F401  (loads verl's plugins, this package's among them)

from recipe_apo import plugin as _plugin  # noqa: E402,F401

__version__ = "0.1.0"
