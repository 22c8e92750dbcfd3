"""APO over a run: the run's anchors, fresh at the start or the checkpoint's on resume, moved once per step.

verl calls the ``apo`` estimator as a plain function on the driver, which reads the run's anchors from the driver
process (``anchor.driver_anchors``) and leaves its per-response Phi_i and C_t and its metrics there. The anchors are
this runtime's (``book``), which the adapters keep in the driver process for the estimator (``estimator_state``),
and what the estimator left comes back in ``StepBatch.estimator_results``. This runtime is the rest:

- a fresh book of anchors for the run (``algorithm.apo.anchor_init``, ``history``); on resume, the checkpoint's
  ``apo_state.json``, or with ``algorithm.apo.on_missing_state=fresh`` a fresh book and a warning when the file is
  missing, unreadable or of the other ``anchor_scope`` (the resume stops otherwise: a long run must not lose its
  anchor unnoticed);
- ``begin_step``: one training step is the paper's iteration t; verl may run the estimator once per mini-batch
  (``parameter_sync_step``), and the book pools them into one anchor update (``AnchorBook.begin_step``);
- the per-response ``data_source`` handed to the estimator with ``anchor_scope=data_source``;
- ``apo/*`` metrics: the estimator's, and at the step's end the anchor, its rate, whether the rate sat at its
  floor ``eta_min``, and the step's pooled y_t (per source with ``data_source``: ``apo/anchor/<source>`` ...);
- the rollout dump's ``apo_phi`` and ``apo_anchor`` (Phi_i and the C_t each response was measured against).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

from recipe_apo.methods.apo import METHOD
from recipe_apo.methods.apo.anchor import GLOBAL_SCOPE, AnchorBook
from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.base import EstimatorInputs, MethodRuntime, StepBatch, StepOutput
from recipe_apo.methods.errors import MethodStateError, StateMismatch

logger = logging.getLogger("recipe_apo")


class AnchorStateError(MethodStateError):
    """A resume cannot restore the APO anchor; the message names the file, the cause and the override."""


class AnchorScopeMismatch(StateMismatch):
    """A saved book of anchors is of the other ``anchor_scope`` than the run's."""


@METHOD.runtime
class ApoRuntime(MethodRuntime):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.settings = ApoSettings.from_algorithm_config(config.algorithm)
        self.by_source = self.settings.anchor_scope == "data_source"
        self.needs = frozenset({"data_sources"}) if self.by_source else frozenset()
        self.book = self.fresh_book()

    def fresh_book(self) -> AnchorBook:
        """Anchors for a run of this run's settings, none measured yet."""
        return AnchorBook(init=self.settings.anchor_init, history=self.settings.history)

    def estimator_state(self) -> AnchorBook:
        """The run's anchors, which the ``apo`` estimator reads and moves."""
        return self.book

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self, step: int) -> dict:
        return self.book.state_dict()

    def load_state_dict(self, state: dict, step: int) -> None:
        """Install the saved anchors, checked whole first and against this run's ``anchor_scope``."""
        book = self.fresh_book()
        book.load_state_dict(state)
        scopes = sorted(book.anchors)
        if scopes and (scopes == [GLOBAL_SCOPE]) != (not self.by_source):
            held = "one global anchor" if scopes == [GLOBAL_SCOPE] else \
                f"anchors per data source ({', '.join(scopes)})"
            raise AnchorScopeMismatch(f"it holds {held} but this run has algorithm.apo.anchor_scope="
                                      f"{self.settings.anchor_scope}")
        self.book = book
        logger.info("recipe-apo: restored the APO anchor (scopes: %s)", ", ".join(book.anchors) or "none")

    def state_needed(self, step: int) -> bool:
        return True

    def state_unreadable(self, path: str, reason: str, step: int) -> None:
        if self.settings.on_missing_state != "fresh":
            raise AnchorStateError(f"cannot resume the APO anchor from {path}: {reason}; set "
                                   "algorithm.apo.on_missing_state=fresh to start the anchor fresh instead")
        self.book = self.fresh_book()
        start = self.settings.anchor_init if self.settings.anchor_init is not None else \
            "null: first batch success rate"
        logger.warning("recipe-apo: %s: %s; the APO anchor restarts fresh (algorithm.apo.on_missing_state=fresh, "
                       "anchor_init=%s)", path, reason, start)

    # ---- the step -------------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.book.begin_step()

    def estimator_inputs(self, batch: StepBatch) -> Optional[EstimatorInputs]:
        if not self.by_source:
            return None
        return EstimatorInputs(scopes=batch.trajectories.finals(batch.data_sources))

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        result = batch.estimator_results.get(self.method.name)
        if result is None:  # the estimator did not run this step, or saw no response with a token
            return StepOutput()
        dump = {"apo_phi": batch.trajectories.broadcast(result.per_response["phi"]),
                "apo_anchor": batch.trajectories.broadcast(result.per_response["anchor"])}
        return StepOutput(metrics=dict(result.metrics), dump=dump)

    def end_step(self, step: int) -> dict[str, float]:
        # verl averages a step's mini-batch metrics; the anchor moved once, with the step's pooled y_t.
        metrics, book = {}, self.book
        for scope, (value, rate, y) in book.step_results.items():
            suffix = f"/{scope}" if self.by_source else ""
            metrics.update({f"apo/anchor{suffix}": value, f"apo/anchor_rate{suffix}": rate,
                            f"apo/batch_success{suffix}": y,
                            f"apo/anchor_rate_at_floor{suffix}": _at_floor(rate, self.settings.eta_min,
                                                                           warm=book.prior(scope) is None)})
        return metrics


def _at_floor(rate: Optional[float], eta_min: float, warm: bool) -> float:
    """1.0 when eta_t sat at its floor (the anchor then moves as a plain exponential average, and eta does
    nothing: docs/internals.md, "The anchor's rate"), else 0.0; NaN for a warm start (its rate is 1 by rule, no
    rate decision) and for no rate."""
    if warm or rate is None or not math.isfinite(rate):
        return float("nan")
    return float(rate == float(eta_min))
