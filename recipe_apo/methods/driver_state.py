"""Everything the recipe passes through the driver process beside verl's arguments, in one place.

verl calls an advantage estimator as a registered plain function on the driver (its TaskRunner actor),
``fn(token_level_rewards, response_mask, config, index, ...)``, and keeps only the (advantages, returns) it
returns. What else an estimator reads or leaves behind has to live in the process. This module owns all of it;
the recipe's trainer hooks (``recipe_apo.integration.hooks``), the testbed and the audit read and write it
through the functions below, never through another module's globals.

- **APO's anchors** (``driver_anchors``): C_t outlives an estimator call, a training step and, through the
  checkpoint, a run. One ``AnchorBook`` per driver; the trainer resets it at the start of a run
  (``reset_driver_anchors``) and installs a checkpoint's on resume (``install_driver_anchors``).
- **What a call is handed** (``handed``): the per-response ``data_source`` for
  ``algorithm.apo.anchor_scope=data_source`` and the old policy's log-probs for CoDaPO, neither of which verl
  passes to an estimator. The trainer holds the context around verl's own advantage step; outside it, nothing is
  handed and the estimators say which trainer they need.
- **What a call leaves** (``last_result``): per-response values the estimator computed and verl drops (APO's
  Phi_i and the C_t each response was measured against, CoDaPO's w_g and uids) and the step's metrics, for the
  hooks to log, dump and resample from. Cleared by the hook before each advantage step, so a step that ran no
  such estimator reads nothing stale.
- **verl's own functions swapped for a while** (``swapped``): the final-output rule for multi-output agent loops
  replaces one name verl's trainer looks up at call time (``recipe_apo.integration.multi_output``); the swap is
  undone when the context ends, also on an error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
import torch

from recipe_apo.methods.anchor import AnchorBook

__all__ = [
    "EstimatorResult", "clear_results", "driver_anchors", "handed", "handed_log_probs", "handed_scopes",
    "install_driver_anchors", "last_result", "record_result", "reset_driver_anchors", "swapped",
]


@dataclass
class EstimatorResult:
    """What one estimator call computed beyond its advantages: metrics, and arrays of one value per response
    in the batch's order (``per_response``)."""

    metrics: dict[str, float] = field(default_factory=dict)
    per_response: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _DriverState:
    anchors: Optional[AnchorBook] = None
    scopes: Optional[np.ndarray] = None
    old_log_probs: Optional[torch.Tensor] = None
    results: dict[str, EstimatorResult] = field(default_factory=dict)


_STATE = _DriverState()


def driver_anchors(init: Optional[float] = None, history: int = 20) -> AnchorBook:
    """The driver's APO anchors, created on first use with ``init`` (C_0) and ``history`` (m)."""
    if _STATE.anchors is None:
        _STATE.anchors = AnchorBook(init=init, history=history)
    return _STATE.anchors


def install_driver_anchors(book: AnchorBook) -> AnchorBook:
    """Make ``book`` the driver's anchors (a restored checkpoint's)."""
    _STATE.anchors = book
    return book


def reset_driver_anchors() -> None:
    """Forget the driver's anchors: the next APO step starts fresh ones (a new run, a new multirun job)."""
    _STATE.anchors = None


@contextlib.contextmanager
def handed(scopes: Optional[Any] = None, old_log_probs: Optional[torch.Tensor] = None) -> Iterator[None]:
    """Hand the estimator calls made while held the per-response ``scopes`` (data sources) and the old policy's
    ``old_log_probs`` (batch, response_len); None hands nothing."""
    previous = (_STATE.scopes, _STATE.old_log_probs)
    _STATE.scopes = None if scopes is None else np.asarray(scopes, dtype=object)
    _STATE.old_log_probs = old_log_probs
    try:
        yield
    finally:
        _STATE.scopes, _STATE.old_log_probs = previous


def handed_scopes() -> Optional[np.ndarray]:
    """The data sources handed for the current advantage step, or None."""
    return _STATE.scopes


def handed_log_probs() -> Optional[torch.Tensor]:
    """The old log-probs handed for the current advantage step, or None."""
    return _STATE.old_log_probs


def record_result(estimator: str, metrics: dict[str, float], **per_response: np.ndarray) -> None:
    """Leave what the ``estimator`` call computed for the hooks (replaces that estimator's previous result)."""
    _STATE.results[estimator] = EstimatorResult(dict(metrics), dict(per_response))


def last_result(estimator: str) -> Optional[EstimatorResult]:
    """What the last ``estimator`` call since ``clear_results`` left, or None."""
    return _STATE.results.get(estimator)


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
