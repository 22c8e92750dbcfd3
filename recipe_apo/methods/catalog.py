"""The one list of the recipe's methods: each a package of ``recipe_apo.methods`` that declares itself with a
``METHOD`` (``recipe_apo.methods.base.Method``). A new method is a new package and one name here.

The order is the order the adapters run the methods' runtimes at each hand-off: a method that rescales the
advantages every other method has seen (the zero-variance denominator) comes last.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from recipe_apo.methods.base import Method

PACKAGES = ("apo", "codapo", "agpo", "agpo_dual", "r2po", "zero_variance")


@functools.lru_cache(maxsize=None)
def methods() -> tuple[Method, ...]:
    """Every method's declaration, in catalog order (importing a declaration is light: its maths load on use)."""
    return tuple(importlib.import_module(f"recipe_apo.methods.{name}").METHOD for name in PACKAGES)


def method(name: str) -> Method:
    """The method named ``name`` (its package's name, the prefix of its metrics)."""
    for candidate in methods():
        if candidate.name == name:
            return candidate
    raise KeyError(f"no method {name!r}; methods: {', '.join(m.name for m in methods())}")


def active(config: Any) -> tuple[Method, ...]:
    """The methods a run of ``config`` uses, in catalog order."""
    return tuple(m for m in methods() if m.active(config))


def estimators() -> dict[str, str]:
    """Every estimator the methods register: name -> ``module:function``."""
    return {name: spec for m in methods() for name, spec in m.estimators.items()}


def losses() -> dict[str, str]:
    """Every policy loss the methods register: name -> ``module:function``."""
    return {name: spec for m in methods() for name, spec in m.losses.items()}


def of_preset(preset: str) -> tuple[Method, ...]:
    """The methods whose declaration names ``preset`` (a file of ``conf/method/``)."""
    return tuple(m for m in methods() if preset in m.presets)


def metric_descriptions() -> dict[str, str]:
    """``<method>/<quantity>`` -> what it means, for every method's declared metrics."""
    return {m.metric(quantity): text for m in methods() for quantity, text in m.metrics.items()}
