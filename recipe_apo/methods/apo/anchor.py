"""The capability anchor C_t (APO paper, section 4.4), kept in the driver process.

Paper symbols and their names here:

- C_t: ``CapabilityAnchor.value``, the model's tracked success rate in [0, 1].
- y_t: ``batch_success``, the mean success s(R) over all responses of a batch.
- H: ``CapabilityAnchor.history``, the last m anchor values (C_0 included at the start).
- eta_t: the rate of one update, ``clip(eta * std(H), eta_min, 1)``; std is the population std (ddof=0).

Update rule: C_{t+1} = (1 - eta_t) C_t + eta_t y_t, then C_{t+1} is appended to H.

With ``eta_min = 0`` this is the paper's rule to the letter, and it has a trap: H starts with the single value
C_0, so std(H) = 0, eta_t = 0 and the anchor never moves. ``eta_min > 0`` (the default, see
``ApoSettings.eta_min``) resolves it; so does nothing else in the paper's formula, since a warm start still
leaves H constant.

verl calls an advantage estimator as a plain function on the driver (the TaskRunner actor), so the estimator reads
the run's anchors from the driver process (``recipe_apo.methods.driver_state``, ``driver_anchors``). They are APO's
runtime's (``ApoRuntime.book``: fresh at the start of each run, saved into each checkpoint, restored on resume),
which the adapters keep there for the estimator; without a runtime (the demo, the audit's replay) the estimator
makes the driver's own on first use.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Optional

import numpy as np

from recipe_apo.methods import driver_state
from recipe_apo.methods.apo.settings import MAX_HISTORY
from recipe_apo.methods.errors import BatchInputError, MethodConfigError, MethodStateError
from recipe_apo.methods.state_codec import MAX_COUNT, is_count, shown, unknown_keys

STATE_VERSION = 1
# The keys of one anchor's state (``CapabilityAnchor.state_dict``).
ANCHOR_KEYS = ("version", "value", "history", "history_len", "steps")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_rate(value: Any) -> bool:
    """A real number in [0, 1]: JSON's true/false and strings are not numbers here."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0.0 <= value <= 1.0)


def _check_version(state: Any) -> None:
    if not isinstance(state, dict) or "version" not in state:
        raise MethodStateError("malformed anchor state: not a mapping with a version")
    version = state["version"]
    if not _is_int(version):
        raise MethodStateError(
            f"malformed anchor state: version must be the integer {STATE_VERSION}, got {version!r}"
        )
    if version != STATE_VERSION:
        raise MethodStateError(f"anchor state version {version} is not supported (expected {STATE_VERSION})")


class CapabilityAnchor:
    """C_t with its history H. Holds no hyperparameters: each update takes them, so state stays plain data."""

    def __init__(self, init: Optional[float] = None, history: int = 20) -> None:
        if history < 1:
            raise MethodConfigError(f"algorithm.apo.history (the anchor's history length) must be >= 1, got {history}")
        self.value: Optional[float] = None if init is None else float(init)
        self.history: deque[float] = deque([] if init is None else [float(init)], maxlen=history)
        self.steps = 0

    def next_rate(self, eta: float, eta_min: float) -> float:
        """eta_t for the next update, from the current history."""
        spread = float(np.std(np.fromiter(self.history, dtype=np.float64))) if self.history else 0.0
        return min(max(eta * spread, eta_min), 1.0)

    def update(self, batch_success: float, eta: float, eta_min: float, history: int) -> tuple[float, float]:
        """Move C_t toward y_t = ``batch_success``; return (C_{t+1}, eta_t).

        The first update of an anchor without a start value is a warm start: C_1 = y_1, eta_1 = 1.
        """
        if not (math.isfinite(batch_success) and 0.0 <= batch_success <= 1.0):
            raise BatchInputError(f"batch success rate must lie in [0, 1], got {batch_success!r}")
        if self.history.maxlen != history:
            self.history = deque(self.history, maxlen=history)
        if self.value is None:
            rate, new_value = 1.0, float(batch_success)
        else:
            rate = self.next_rate(eta, eta_min)
            new_value = (1.0 - rate) * self.value + rate * float(batch_success)
        self.value = new_value
        self.history.append(new_value)
        self.steps += 1
        return new_value, rate

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state: plain floats, ints and lists."""
        return {
            "version": STATE_VERSION,
            "value": self.value,
            "history": list(self.history),
            "history_len": self.history.maxlen,
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from ``state_dict``; a malformed state raises ``MethodStateError`` (a ``RecipeError``
        and a ``ValueError``) and leaves this anchor unchanged.

        Types are checked, not coerced: ``"1"``, ``1.9`` or ``true`` where an integer or a rate belongs means
        the file is not what this code wrote, and restoring it would run on made-up numbers. So are the bounds
        ``update`` keeps: no key but the five it writes; a history no longer than ``history_len`` (a deque of that
        length never holds more), ending at ``value`` (each update appends the new value) and holding at most one
        value more than ``steps`` (the start, C_0); no value and no history before the first update; ``steps`` a
        whole number in [0, ``state_codec.MAX_COUNT``].
        """
        _check_version(state)
        unknown = unknown_keys(state, ANCHOR_KEYS)
        if unknown:
            raise MethodStateError(f"malformed anchor state: keys the recipe does not write: {unknown}")
        missing = [key for key in ANCHOR_KEYS if key not in state]
        if missing:
            raise MethodStateError(f"malformed anchor state: missing {', '.join(missing)}")
        value, history, history_len, steps = state["value"], state["history"], state["history_len"], state["steps"]
        if value is not None and not _is_rate(value):
            raise MethodStateError(f"malformed anchor state: value must be null or a number in [0, 1], got {value!r}")
        if not isinstance(history, list) or not all(_is_rate(v) for v in history):
            raise MethodStateError("malformed anchor state: history must be a list of numbers in [0, 1]")
        if not _is_int(history_len) or not 1 <= history_len <= MAX_HISTORY:
            raise MethodStateError(
                f"malformed anchor state: history_len must be an integer in [1, {MAX_HISTORY}], got {history_len!r}"
            )
        if not is_count(steps):
            raise MethodStateError(f"malformed anchor state: steps must be an integer in [0, {MAX_COUNT}], got "
                                   f"{shown(steps)}")
        if len(history) > history_len:
            raise MethodStateError(f"malformed anchor state: a history of {len(history)} values is longer than its "
                                   f"history_len {history_len}")
        if len(history) > steps + 1:
            raise MethodStateError(f"malformed anchor state: a history of {len(history)} values after {steps} "
                                   "updates (each update adds one, the start one more)")
        if (value is None) != (not history) or (history and history[-1] != value):
            raise MethodStateError("malformed anchor state: the history must end at the value (both empty before "
                                   "the first update without a start value)")
        if value is None and steps:
            raise MethodStateError(f"malformed anchor state: no value after {steps} updates")
        self.value = None if value is None else float(value)
        self.history = deque((float(v) for v in history), maxlen=history_len)
        self.steps = steps


GLOBAL_SCOPE = "global"


class AnchorBook:
    """The anchors of one run, by scope: ``"global"``, or one per ``data_source`` (``anchor_scope``).

    New scopes start from ``init`` (None: a warm start at their first batch's success rate).

    One training step is the paper's iteration t. verl may run the estimator several times in one step (its V1
    trainers' ``parameter_sync_step``: one call per mini-batch); between ``begin_step`` calls, each call moves a
    scope's anchor once from where the step began, with y_t pooled over the step's calls so far, so a step's
    responses fed as one batch or as several mini-batches end the step with the same anchors (eta_t and the
    history advance once per step either way). A mini-batch before the step's last is measured against the
    anchor of the success seen so far. Without ``begin_step`` (plain verl, a bare estimator call) every call is
    a step of its own.
    """

    def __init__(self, init: Optional[float] = None, history: int = 20) -> None:
        self.init = init
        self.history = history
        self.anchors: dict[str, CapabilityAnchor] = {}
        # An open step: each scope's state when it began (None: the scope did not exist) and what it has seen.
        self._step_start: Optional[dict[str, Optional[dict[str, Any]]]] = None
        self._step_seen: dict[str, tuple[float, float]] = {}
        # Per scope moved in the open step: (C_{t+1}, eta_t, y_t) after its latest batch, i.e. the step's update.
        self.step_results: dict[str, tuple[float, float, float]] = {}

    def anchor(self, scope: str = GLOBAL_SCOPE) -> CapabilityAnchor:
        if scope not in self.anchors:
            self.anchors[scope] = CapabilityAnchor(init=self.init, history=self.history)
        return self.anchors[scope]

    def begin_step(self) -> None:
        """Open a training step: the estimator calls until the next ``begin_step`` share one anchor update."""
        self._step_start = {scope: anchor.state_dict() for scope, anchor in self.anchors.items()}
        self._step_seen, self.step_results = {}, {}

    def prior(self, scope: str) -> Optional[float]:
        """C_t of ``scope`` before this step's update: where the open step began, else its current value. A scope
        first seen in this step starts from ``init`` (C_0), so that is its prior; None only for a warm start."""
        if self._step_start is not None:
            start = self._step_start.get(scope)
            return self.init if start is None else start["value"]
        return self.anchors[scope].value if scope in self.anchors else self.init

    def observe(self, scope: str, successes: float, responses: float, eta: float, eta_min: float,
                history: int) -> tuple[float, float, float]:
        """Move ``scope``'s anchor with a batch of ``responses`` (> 0) whose successes sum to ``successes``;
        return (C_{t+1}, eta_t, the y_t used). In an open step y_t pools the step's batches so far."""
        if self._step_start is None:
            y = successes / responses
            return (*self.anchor(scope).update(y, eta, eta_min, history), y)
        seen = self._step_seen.get(scope)
        if seen is not None:
            successes, responses = seen[0] + successes, seen[1] + responses
        self._step_seen[scope] = (successes, responses)
        y = successes / responses
        anchor = CapabilityAnchor(init=self.init, history=self.history)
        if self._step_start.get(scope) is not None:
            anchor.load_state_dict(self._step_start[scope])
        value, rate = anchor.update(y, eta, eta_min, history)
        self.anchors[scope] = anchor
        self.step_results[scope] = (value, rate, y)
        return value, rate, y

    def state_dict(self) -> dict[str, Any]:
        """JSON-safe state of every anchor."""
        return {"version": STATE_VERSION, "anchors": {k: a.state_dict() for k, a in self.anchors.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace all anchors by those in ``state``; a malformed state raises and changes nothing."""
        _check_version(state)
        unknown = unknown_keys(state, ("version", "anchors"))
        if unknown:
            raise MethodStateError(f"malformed anchor state: keys the recipe does not write: {unknown}")
        items = state.get("anchors")
        if not isinstance(items, dict) or not all(isinstance(scope, str) for scope in items):
            raise MethodStateError(
                "malformed anchor state: anchors must be a mapping from scope names to anchor states"
            )
        restored = {}
        for scope, anchor_state in items.items():
            anchor = CapabilityAnchor(history=self.history)
            anchor.load_state_dict(anchor_state)
            restored[str(scope)] = anchor
        self.anchors = restored
        self._step_start, self._step_seen, self.step_results = None, {}, {}


# The driver's anchors (``recipe_apo.methods.driver_state``): one book per driver process, the run's, kept under the
# method's name (where the adapters keep APO's runtime's ``estimator_state``).
_KEY = "apo"


def driver_anchors(init: Optional[float] = None, history: int = 20) -> AnchorBook:
    """The driver's APO anchors, created on first use with ``init`` (C_0) and ``history`` (m)."""
    return driver_state.kept(_KEY, lambda: AnchorBook(init=init, history=history))


def reset_driver_anchors() -> None:
    """Forget the driver's anchors: the next APO step starts fresh ones (a new run, a new multirun job)."""
    driver_state.forget(_KEY)
