"""The reward's settings from the environment (``RECIPE_APO_REWARD_TIMEOUT``, ``_WORKERS``, ``_MEMORY_MB``), checked."""

from __future__ import annotations

import os
from typing import Any

from recipe_apo.errors import RecipeError
from recipe_apo.reward.worker import DEFAULT_MEMORY_MB, MEMORY_ENV

DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_ENV = "RECIPE_APO_REWARD_TIMEOUT"
WORKERS_ENV = "RECIPE_APO_REWARD_WORKERS"

__all__ = ["DEFAULT_MEMORY_MB", "DEFAULT_TIMEOUT_S", "MEMORY_ENV", "TIMEOUT_ENV", "WORKERS_ENV", "RewardConfigError",
           "env_settings"]


class RewardConfigError(RecipeError, ValueError):
    """A setting of the reward (environment variable or ``reward_kwargs``) is invalid; the message names it."""


def _number(name: str, raw: Any, integer: bool, minimum: float) -> float:
    """``raw`` as a finite number >= ``minimum`` (an integer when ``integer``), or RewardConfigError naming ``name``."""
    kind = "an integer" if integer else "a number"
    try:
        value = int(raw) if integer and not isinstance(raw, float) else float(raw)
    except (TypeError, ValueError):
        value = None
    if isinstance(raw, bool) or value is None or value != value or value in (float("inf"), float("-inf")) \
            or value < minimum:
        raise RewardConfigError(f"{name}={raw!r} must be {kind} >= {minimum:g}")
    return value


def _env_number(name: str, default: float, integer: bool, minimum: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    return _number(name, raw.strip(), integer, minimum)


def env_settings() -> dict[str, float]:
    """The reward's environment settings, checked: ``timeout`` (s), ``workers``, ``memory_mb``."""
    timeout = _env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, integer=False, minimum=0.0)
    if timeout <= 0:
        raise RewardConfigError(f"{TIMEOUT_ENV}={os.environ[TIMEOUT_ENV]!r} must be a number > 0")
    return {
        "timeout": timeout,
        "workers": int(_env_number(WORKERS_ENV, min(4, os.cpu_count() or 1), integer=True, minimum=1)),
        "memory_mb": int(_env_number(MEMORY_ENV, DEFAULT_MEMORY_MB, integer=True, minimum=0)),
    }
