"""The base of every error the recipe raises on purpose.

Each layer defines its own errors (``methods.errors`` for bad batches and settings, ``integration.errors`` for
configs and state files, ``reward``, ``audit``) as subclasses of ``RecipeError``; each message is one line that
names the setting, file or data at fault. ``python -m recipe_apo.main`` says any ``RecipeError``, raised in
any process and carried back through Ray's cause chains, as that one line. This module imports nothing, so
every layer may import it.
"""


class RecipeError(Exception):
    """An error the recipe raises on purpose: its message alone tells the user what to change."""
