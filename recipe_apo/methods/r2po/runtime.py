"""R2PO over a run: the phase of each step (``schedule``), handed to the ``r2po`` estimator (its
``estimator_state``, which the adapters keep in the driver process) and to the policy's passes (``actor_call``): in
a head step the old log-probs and the update use pi_roll, in a policy step pi_base; the reference's log-probs are
always pi_base (the original model, without its head); the optimizer restarts at the first step of every phase (the
source runs each phase as a fresh process). Metrics every step: ``r2po/phase`` (0 head, 1 policy), ``r2po/round``,
and the phase's share of skipped groups. No state: the phase is a function of the step, so a resumed run continues
the schedule."""

from __future__ import annotations

from typing import Any, Optional

from recipe_apo.methods.base import ActorCall, MethodRuntime, StepBatch, StepOutput
from recipe_apo.methods.r2po import METHOD
from recipe_apo.methods.r2po.estimator import ESTIMATOR
from recipe_apo.methods.r2po.model import BASE, ROLL
from recipe_apo.methods.r2po.schedule import HEAD, POLICY, Phase, phase_at
from recipe_apo.methods.r2po.settings import R2poSettings

SKIPPED = {HEAD: "rarity_skipped_share", POLICY: "range_skipped_share"}


@METHOD.runtime
class R2poRuntime(MethodRuntime):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.settings = R2poSettings.from_algorithm_config(config.algorithm)
        self.step_phase: Optional[int] = None  # the phase of the step under way (``begin_step``)

    def phase(self, step: int) -> Phase:
        return phase_at(step, self.settings)

    def begin_step(self, step: int) -> None:
        self.step_phase = self.phase(step).phase

    def estimator_state(self) -> Optional[int]:
        """The phase of the step under way, which the ``r2po`` estimator reads (None before the first step)."""
        return self.step_phase

    def actor_call(self, step: int, call: str) -> Optional[ActorCall]:
        phase = self.phase(step)
        head = ROLL if phase.phase == HEAD and call != "ref_log_probs" else BASE
        return ActorCall(logits_head=head, restart_optimizer=call == "update" and phase.first)

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        result = batch.estimator_results.get(ESTIMATOR)
        if result is None:
            return StepOutput()
        rows = result.per_response
        share = float(rows["skipped"].sum() / max(int(rows["valid"].sum()), 1))
        return StepOutput(metrics={self.method.metric(SKIPPED[self.phase(step).phase]): share})

    def end_step(self, step: int) -> dict[str, float]:
        phase = self.phase(step)
        return {self.method.metric("phase"): float(phase.phase), self.method.metric("round"): float(phase.round)}
