"""R2PO's settings, ``algorithm.r2po``: the schedule of its two phases (the released code's ``2stage_train.sh``,
RRPO-ARR/Code at 8a2cc4d)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from recipe_apo.methods.checks import check_integer
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.settings import read_settings

# A phase longer than this is a typo (a million steps of one phase is no schedule).
MAX_PHASE_STEPS = 1_000_000
# The released schedule: 20 head steps every round, then 40, 40, 20, 20, ... policy steps.
RELEASED_POLICY_STEPS = (40, 40, 20)


class R2poConfigError(MethodConfigError):
    """A setting under ``algorithm.r2po`` is invalid; the message names the key."""


@dataclass(frozen=True)
class R2poSettings:
    """The ``algorithm.r2po`` settings, each checked for its type and bounds.

    A run alternates rounds, each a head phase (only ``rollout_head.*`` trains, on the rarity advantage) followed by
    a policy phase (everything else trains, on GRPO's advantage); the first step is the first head step.
    """

    # Steps of every round's head phase (the released script runs 20, its head stage's default).
    head_steps: int = 20
    # Steps of each round's policy phase: one int for every round, or a list, one per round, its last repeated
    # (the released script's 40, 40, 20, 20, ...).
    policy_steps: Union[int, tuple[int, ...]] = RELEASED_POLICY_STEPS

    def __post_init__(self) -> None:
        check_integer("algorithm.r2po.head_steps", self.head_steps, R2poConfigError, low=1, high=MAX_PHASE_STEPS)
        steps = self.policy_steps
        if isinstance(steps, (list, tuple)):
            if not steps:
                raise R2poConfigError("algorithm.r2po.policy_steps must be an integer or a non-empty list of "
                                      "integers, got []")
            for i, value in enumerate(steps):
                check_integer(f"algorithm.r2po.policy_steps[{i}]", value, R2poConfigError, low=1,
                              high=MAX_PHASE_STEPS)
            object.__setattr__(self, "policy_steps", tuple(int(v) for v in steps))
        else:
            check_integer("algorithm.r2po.policy_steps", steps, R2poConfigError, low=1, high=MAX_PHASE_STEPS)
            object.__setattr__(self, "policy_steps", (int(steps),))

    @classmethod
    def from_algorithm_config(cls, algorithm_config: Any) -> "R2poSettings":
        """Read ``algorithm_config.r2po`` (an OmegaConf node, a dict, or absent); unknown keys are refused."""
        return read_settings(cls, algorithm_config, "r2po", R2poConfigError)
