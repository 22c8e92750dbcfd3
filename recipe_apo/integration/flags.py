"""The boolean settings the recipe reads or checks, each refused unless it is a real boolean.

Hydra keeps ``algorithm.norm_adv_by_std_in_grpo='false'`` (quoted) as the string ``'false'``, and verl tests its
flags with ``if flag:``: a non-empty string is true, so the run silently did the opposite of what it said. The
flags of verl's ``algorithm`` node are read off verl's own typed config (``AlgoConfig`` and the configs nested in
it), so a flag verl adds is checked without a change here; the recipe's own method settings check theirs
(``algorithm.apo.reweight``, ``algorithm.codapo.resample``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator

from omegaconf import OmegaConf

from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.methods.checks import check_flag

# Flags outside verl's algorithm node that the recipe reads: its own dry_run, and the two verl keys its checks
# and warnings read (trainer.use_v1 in validation, actor.shuffle in config_warnings).
RECIPE_FLAGS = ("dry_run", "trainer.use_v1", "actor_rollout_ref.actor.shuffle")


def _typed_flags(cls: type, prefix: str) -> Iterator[tuple[str, bool]]:
    """(dotted key, may be null) of every field typed bool in the dataclass ``cls``, nested configs included."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        args = typing.get_args(hint)
        if hint is bool or bool in args:
            yield prefix + field.name, type(None) in args
        for inner in (hint, *args):
            if dataclasses.is_dataclass(inner):
                yield from _typed_flags(inner, f"{prefix}{field.name}.")


def boolean_settings() -> list[tuple[str, bool]]:
    """Every flag the launch checks: verl's typed algorithm flags, then the recipe's own."""
    from verl.trainer.config import AlgoConfig

    return [*_typed_flags(AlgoConfig, "algorithm."), *((key, False) for key in RECIPE_FLAGS)]


_ABSENT = object()


def check_flags(config: Any) -> None:
    """Raise ``RecipeConfigError`` naming the first flag of ``config`` that is set to anything but true/false
    (absent keys keep verl's defaults, which are booleans)."""
    for key, nullable in boolean_settings():
        value = OmegaConf.select(config, key, default=_ABSENT)
        if value is _ABSENT or (value is None and nullable):
            continue
        check_flag(key, value, RecipeConfigError)
