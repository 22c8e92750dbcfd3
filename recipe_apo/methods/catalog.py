"""The recipe's methods: every package of ``recipe_apo.methods`` whose ``__init__`` declares a ``METHOD``
(``recipe_apo.methods.base.Method``), found where they lie. A new method is a new package; nothing here names one.

The order is the order the adapters run the methods' runtimes at each hand-off, the launch runs their checks and
the reports list them: a method that rescales the advantages every other method has seen (``rescales_advantages``:
the zero-variance denominator) comes last; the others by their declared ``order``, then those without one by name
(``place``). Every list of methods, estimators, losses and metric roles derives from the declarations here.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any, Callable

from recipe_apo.methods.base import Method, Metric


def place(method: Method) -> tuple:
    """A method's place in every list of methods (the module's docstring)."""
    return method.rescales_advantages, method.order is None, method.order or 0, method.name


@functools.lru_cache(maxsize=None)
def methods() -> tuple[Method, ...]:
    """Every method's declaration, in catalog order: the packages of ``recipe_apo.methods`` that declare one."""
    from recipe_apo import methods as package

    found = []
    for module in pkgutil.iter_modules(package.__path__):
        if not module.ispkg:
            continue
        declared = getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "METHOD", None)
        if declared is None:
            continue
        if not isinstance(declared, Method) or declared.name != module.name:
            raise TypeError(f"recipe_apo.methods.{module.name}.METHOD must be a Method named {module.name!r}, got "
                            f"{declared!r}")
        found.append(declared)
    return tuple(sorted(found, key=place))


def names() -> tuple[str, ...]:
    """The methods' names (their packages'), in catalog order."""
    return tuple(m.name for m in methods())


def method(name: str) -> Method:
    """The method named ``name`` (its package's name, the prefix of its metrics)."""
    for candidate in methods():
        if candidate.name == name:
            return candidate
    raise KeyError(f"no method {name!r}; methods: {', '.join(names())}")


def active(config: Any) -> tuple[Method, ...]:
    """The methods a run of ``config`` uses, in catalog order."""
    return tuple(m for m in methods() if m.active(config))


def estimators() -> dict[str, Callable]:
    """Every estimator the methods register with verl: name -> function."""
    return {name: function for m in methods() for name, function in m.estimators.items()}


def losses() -> dict[str, Callable]:
    """Every policy loss the methods register with verl: name -> function."""
    return {name: function for m in methods() for name, function in m.losses.items()}


def std_norm_estimators() -> tuple[str, ...]:
    """The methods' estimators that read ``algorithm.norm_adv_by_std_in_grpo`` (``Estimator.reads_std_norm``)."""
    return tuple(name for m in methods() for name, e in m.parts.estimators.items() if e.reads_std_norm)


def of_preset(preset: str) -> tuple[Method, ...]:
    """The methods whose declaration names ``preset`` (a file of ``conf/method/``)."""
    return tuple(m for m in methods() if preset in m.presets)


def metrics() -> dict[str, Metric]:
    """Every metric the methods declare, by its one name: each method's own (``<method>/<quantity>``), then what its
    losses log (``actor/<method>_<quantity>``), in catalog order."""
    found: dict[str, Metric] = {}
    for m in methods():
        found.update({m.metric(quantity): declared for quantity, declared in m.metrics.items()})
        found.update(m.loss_metrics)
    return found


def runtime_metrics() -> dict[str, Metric]:
    """The methods' own metrics (``<method>/<quantity>``, what their runtimes give), in catalog order."""
    return {m.metric(quantity): declared for m in methods() for quantity, declared in m.metrics.items()}


def headline_metrics() -> tuple[str, ...]:
    """The metrics the CPU rehearsal's table shows (``Metric.headline``), in ``metrics()``'s order."""
    return tuple(name for name, declared in metrics().items() if declared.headline)


def trust_metrics() -> dict[str, Metric]:
    """The metrics the league's generation and trust-region table shows (``Metric.trust``)."""
    return {name: declared for name, declared in metrics().items() if declared.trust}


def league_metrics() -> dict[str, Metric]:
    """The metrics the league's table of each method's own workings shows (``Metric.league``)."""
    return {name: declared for name, declared in metrics().items() if declared.league}


def featured() -> tuple[Method, ...]:
    """The methods the recipe is about (``Method.featured``), in catalog order."""
    return tuple(m for m in methods() if m.featured)
