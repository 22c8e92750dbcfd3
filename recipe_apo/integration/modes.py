"""verl's V1 trainer modes and the recipe's trainer for each (no verl import: the launch checks read it).

A user names the verl mode they know, ``trainer.v1.trainer_mode=sync|colocate_async|separate_async``; the recipe
runs its own trainer for it (``recipe_apo.integration.trainer``: verl's class of that mode with the recipe's
hooks), registered with verl under the recipe's name. verl itself switches its asynchronous code paths on the
exact mode string, so each recipe trainer sets the string back to verl's before verl reads it.
"""

from __future__ import annotations

from typing import Any

# verl's mode -> the recipe's trainer registered for it.
RECIPE_TRAINERS = {"sync": "apo_sync", "colocate_async": "apo_colocate_async", "separate_async": "apo_separate_async"}
VERL_MODES = {recipe: verl for verl, recipe in RECIPE_TRAINERS.items()}
ASYNC_MODES = ("colocate_async", "separate_async")


def recipe_mode(mode: Any) -> Any:
    """The trainer the recipe runs for ``mode``: its own for a verl mode, anything else (a user's trainer, or a
    value the launch's mode check then refuses) as is."""
    return RECIPE_TRAINERS.get(mode, mode)


def is_recipe_trainer(mode: str) -> bool:
    return mode in VERL_MODES


def verl_mode(mode: str) -> str:
    """verl's mode under a recipe trainer's name (a name verl does not know comes back as is)."""
    return VERL_MODES.get(mode, mode)
