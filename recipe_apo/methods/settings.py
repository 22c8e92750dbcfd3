"""Reading one method's settings node (``algorithm.<key>``) into its frozen settings dataclass; the typed checks
of its values are ``recipe_apo.methods.checks``'."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from recipe_apo.methods.checks import check_flag

__all__ = ["read_flag", "read_settings"]

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


def read_flag(algorithm_config: Any, key: str, default: bool, error: type[Exception]) -> bool:
    """``algorithm_config.<key>`` (a node, a dict, or None for the default) checked by ``check_flag``."""
    if algorithm_config is None:
        return default
    getter = getattr(algorithm_config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(algorithm_config, key, default)
    return check_flag(f"algorithm.{key}", value, error)
