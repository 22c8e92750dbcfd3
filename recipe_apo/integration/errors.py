"""The verl integration's errors, each a ``RecipeError`` whose message names the setting or file at fault."""

from recipe_apo.errors import RecipeError


class RecipeConfigError(RecipeError, ValueError):
    """A setting the recipe refuses before Ray starts (the launch exits with code 2 and this one line)."""


class AnchorStateError(RecipeError, ValueError):
    """A resume cannot restore the APO anchor; the message names the file, the cause and the override."""


class ResamplingStateError(RecipeError, RuntimeError):
    """A checkpoint lacks the kept prompts its resumed step needs; the message names the file."""


class NodeCheckError(RecipeError, RuntimeError):
    """A Ray node lacks the recipe's estimators or loss, or did not answer the start-up check."""
