"""Reading one method's settings node (``algorithm.<key>``) into its frozen settings dataclass, and the typed
checks every method's settings share: numbers within bounds, booleans that are booleans."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Optional, TypeVar

__all__ = ["check_flag", "check_number", "read_flag", "read_settings"]

T = TypeVar("T")


def read_settings(cls: type[T], algorithm_config: Any, key: str, error: type[Exception]) -> T:
    """``cls(**algorithm_config.<key>)`` from an OmegaConf node, a dict, or nothing (the defaults).

    An unknown key is refused with ``error`` naming it and the known ones: a typo such as ``lambda_sacle``
    must not pass unnoticed. Shared by every method's settings.
    """
    node = None
    if algorithm_config is not None:
        getter = getattr(algorithm_config, "get", None)
        node = getter(key, None) if callable(getter) else getattr(algorithm_config, key, None)
    if node is None:
        return cls()
    if not isinstance(node, dict):
        # Imported here: a dict or no node at all needs no OmegaConf.
        from omegaconf import DictConfig, OmegaConf

        if not isinstance(node, DictConfig):
            raise error(f"algorithm.{key} must be a mapping of settings, got {type(node).__name__}")
        node = OmegaConf.to_container(node, resolve=True)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(node) - known)
    if unknown:
        raise error(f"unknown setting algorithm.{key}.{unknown[0]}; known settings: {', '.join(sorted(known))}")
    return cls(**node)


def check_number(
    name: str,
    value: Any,
    error: type[Exception],
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_open: bool = False,
) -> None:
    """Refuse with ``error`` naming ``name`` (``algorithm.<method>.<key>``) anything but a finite real number in
    the bounds. ``true`` is not 1 here, nor ``"1.5"`` 1.5: a setting of the wrong type is a typo somewhere."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise error(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        raise error(f"{name} must be <= {high}, got {value!r}")


def check_flag(name: str, value: Any, error: type[Exception]) -> bool:
    """``value`` if it is a bool, else ``error`` naming ``name``. A quoted ``'false'`` is a non-empty string,
    which Python (and verl, which tests ``if flag:``) reads as true."""
    if not isinstance(value, bool):
        hint = " (a string: drop the quotes)" if isinstance(value, str) else ""
        raise error(f"{name} must be true or false, got {value!r}{hint}")
    return value


def read_flag(algorithm_config: Any, key: str, default: bool, error: type[Exception]) -> bool:
    """``algorithm_config.<key>`` (a node, a dict, or None for the default) checked by ``check_flag``."""
    if algorithm_config is None:
        return default
    getter = getattr(algorithm_config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(algorithm_config, key, default)
    return check_flag(f"algorithm.{key}", value, error)
