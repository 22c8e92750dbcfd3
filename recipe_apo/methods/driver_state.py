"""Everything the recipe passes through the driver process beside verl's arguments, in one place.

verl calls an advantage estimator as a registered plain function on the driver (its TaskRunner actor),
``fn(token_level_rewards, response_mask, config, index, ...)``, and keeps only the (advantages, returns) it
returns. What else an estimator reads or leaves behind has to live in the process. This module owns all of it; the
estimators read and write it through the functions below, never through another module's globals, and so do the
adapters that drive the methods' runtimes (``recipe_apo.methods.handoff``), the audit and the tests. A runtime
(``recipe_apo.methods.<method>.runtime``) never does: it sees arguments and return values only.

- **A method's state that outlives an estimator call** (``kept``): APO's anchors (C_t outlives a call, a step
  and, through the checkpoint, a run), R2PO's phase of the step; each is its runtime's ``estimator_state()``, which
  the adapters keep here under the method's name (``keep``; ``forget`` when it has none).
- **What a call is handed** (``handed``): the per-response ``data_source`` for
  ``algorithm.apo.anchor_scope=data_source`` and the old policy's log-probs for CoDaPO, neither of which verl
  passes to an estimator. The adapters hold the context around verl's own advantage step; outside it, nothing is
  handed and the estimators say which trainer they need.
- **What a call leaves** (``last_result``, ``results``): per-response values the estimator computed and verl drops
  (APO's Phi_i and the C_t each response was measured against, CoDaPO's w_g and uids) and the step's metrics, which
  the adapters hand the runtimes (``StepBatch.estimator_results``) to log, dump and resample from. Cleared before
  each advantage step, so a step that ran no such estimator reads nothing stale.
- **verl's own functions swapped for a while** (``swapped``): the final-output rule for multi-output agent loops
  replaces one name verl's trainer looks up at call time (``recipe_apo.integration.multi_output``); the swap is
  undone when the context ends, also on an error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, TypeVar

import numpy as np
import torch

from recipe_apo.methods.base import EstimatorResult

__all__ = [
    "EstimatorResult", "clear_results", "forget", "handed", "handed_log_probs", "handed_scopes", "keep", "kept",
    "last_result", "record_result", "results", "swapped",
]

T = TypeVar("T")


@dataclass
class _DriverState:
    # A method's state kept between estimator calls, by method name (``kept``).
    kept: dict[str, Any] = field(default_factory=dict)
    # What the current advantage step hands the estimators, by name (``handed``).
    inputs: dict[str, Any] = field(default_factory=dict)
    results: dict[str, EstimatorResult] = field(default_factory=dict)


_STATE = _DriverState()


def kept(name: str, create: Callable[[], T]) -> T:
    """The driver's state of method ``name``, made by ``create()`` on first use."""
    if name not in _STATE.kept:
        _STATE.kept[name] = create()
    return _STATE.kept[name]


def keep(name: str, value: T) -> T:
    """Make ``value`` the driver's state of method ``name`` (a restored checkpoint's)."""
    _STATE.kept[name] = value
    return value


def forget(name: str) -> None:
    """Forget method ``name``'s state: its next use starts fresh (a new run, a new multirun job)."""
    _STATE.kept.pop(name, None)


@contextlib.contextmanager
def handed(scopes: Optional[Any] = None, old_log_probs: Optional[torch.Tensor] = None) -> Iterator[None]:
    """Hand the estimator calls made while held the per-response ``scopes`` (data sources) and the old policy's
    ``old_log_probs`` (batch, response_len); None hands nothing (what an outer ``handed`` gave stays). Several
    runtimes each hold their own."""
    previous = dict(_STATE.inputs)
    if scopes is not None:
        _STATE.inputs["scopes"] = np.asarray(scopes, dtype=object)
    if old_log_probs is not None:
        _STATE.inputs["old_log_probs"] = old_log_probs
    try:
        yield
    finally:
        _STATE.inputs = previous


def handed_scopes() -> Optional[np.ndarray]:
    """The data sources handed for the current advantage step, or None."""
    return _STATE.inputs.get("scopes")


def handed_log_probs() -> Optional[torch.Tensor]:
    """The old log-probs handed for the current advantage step, or None."""
    return _STATE.inputs.get("old_log_probs")


def record_result(estimator: str, metrics: dict[str, float], **per_response: np.ndarray) -> None:
    """Leave what the ``estimator`` call computed for the hooks (replaces that estimator's previous result)."""
    _STATE.results[estimator] = EstimatorResult(dict(metrics), dict(per_response))


def last_result(estimator: str) -> Optional[EstimatorResult]:
    """What the last ``estimator`` call since ``clear_results`` left, or None."""
    return _STATE.results.get(estimator)


def results() -> dict[str, EstimatorResult]:
    """What every estimator call since ``clear_results`` left, by estimator name (the last call's of each)."""
    return dict(_STATE.results)


def clear_results(*estimators: str) -> None:
    """Forget the named estimators' last results (all of them when none is named)."""
    for name in estimators or tuple(_STATE.results):
        _STATE.results.pop(name, None)


@contextlib.contextmanager
def swapped(module: Any, name: str, replacement: Any) -> Iterator[None]:
    """``module.<name>`` is ``replacement`` while held, and what it was afterwards (also on an error)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)
