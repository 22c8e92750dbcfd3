"""Which phase a step of an R2PO run is in: rounds of ``head_steps`` head steps then ``policy_steps[r]`` policy steps
(``R2poSettings``), steps counted from 1 as verl's ``global_steps``. A pure function of the step, so a resumed run
continues the schedule where it stopped with no state of its own."""

from __future__ import annotations

from dataclasses import dataclass

from recipe_apo.methods.r2po.settings import R2poSettings

HEAD = 0    # r2po/phase: only the rollout head trains, samples and old log-probs from pi_roll
POLICY = 1  # r2po/phase: everything but the head trains, on pi_base's ratio, samples still from pi_roll


@dataclass(frozen=True)
class Phase:
    """Step ``step``'s place in the schedule: its ``phase`` (HEAD or POLICY), its ``round`` (from 0) and its
    ``index`` within the phase (from 1; 1 is the phase's first step, where the optimizer restarts)."""

    step: int
    phase: int
    round: int
    index: int

    @property
    def first(self) -> bool:
        return self.index == 1


def phase_at(step: int, settings: R2poSettings) -> Phase:
    """The phase of training step ``step`` (>= 1)."""
    if step < 1:
        raise ValueError(f"training steps count from 1, got {step}")
    remaining, round_ = step, 0
    while True:  # one turn per round: a step far into a run with phases of one step is ~step/2 turns
        if remaining <= settings.head_steps:
            return Phase(step, HEAD, round_, remaining)
        remaining -= settings.head_steps
        policy = settings.policy_steps[min(round_, len(settings.policy_steps) - 1)]
        if remaining <= policy:
            return Phase(step, POLICY, round_, remaining)
        remaining -= policy
        round_ += 1
