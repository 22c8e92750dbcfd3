"""The verl integration's errors, each a ``RecipeError`` whose message names the setting or file at fault."""

from recipe_apo.errors import RecipeError


class RecipeConfigError(RecipeError, ValueError):
    """A setting the recipe refuses before Ray starts (the launch exits with code 2 and this one line)."""


class NodeCheckError(RecipeError, RuntimeError):
    """A Ray node lacks the recipe's estimators or loss, or did not answer the start-up check."""


def cause_of(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line: a loader's message (pickle's, torch's) may span several,
    and a state file's error is said as one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
