"""The testbed's refusals: a setting, an output folder or a state the testbed will not run with.

``python -m recipe_apo.testbed`` says each as the recipe's one line, ``recipe-apo: error: <message>``, exit status
2, no traceback (``recipe_apo.testbed.preflight.refusal``). This module imports nothing but the recipe's base error,
so every part of the testbed may import it.
"""

from recipe_apo.errors import RecipeError


class TestbedSettingError(RecipeError, ValueError):
    """A testbed setting (or its output folder) refused before any work starts. The message is one line,
    ``<key>=<value>: <what is allowed>``, naming the setting at fault."""

    __test__ = False  # not a pytest test class, whatever its name
