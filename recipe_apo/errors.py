"""The base of every error the recipe raises on purpose.

Each layer defines its own errors (``methods.errors`` for bad batches and settings, ``integration.errors`` for
configs and state files, ``reward``, ``audit``) as subclasses of ``RecipeError``; each message is one line that
names the setting, file or data at fault. ``python -m recipe_apo.main`` says any ``RecipeError``, raised in
any process and carried back through Ray's cause chains, as that one line. This module imports nothing, so
every layer may import it.
"""


class RecipeError(Exception):
    """An error the recipe raises on purpose: its message alone tells the user what to change."""


def recipe_error(exc: BaseException) -> "RecipeError | None":
    """The recipe's own error (a ``RecipeError``: bad data, setting or state file) behind an exception, if any.

    Ray re-raises a remote error as ``RayTaskError`` with the original under ``.cause``, nested once per actor
    it crossed (agent loop -> task runner -> here); Ray's copy is itself an instance of the original's class,
    so only an error without ``.cause`` is the original. Python's own chains (``__cause__``, ``__context__``)
    are followed too, e.g. Hydra's wrapping of an error raised while it composes.
    """
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, RecipeError) and not hasattr(current, "cause"):
            return current
        todo += [getattr(current, "cause", None), current.__cause__, current.__context__]
    return None
