"""R2PO's settings, ``algorithm.r2po``: the schedule of its two phases (the released code's ``2stage_train.sh``,
RRPO-ARR/Code at 8a2cc4d).

What the released code trains with beside its schedule, and what the recipe does instead (docs/beside_apo.md):

- **Its step is one group, and two steps make an update.** Each step trains one prompt's 8 responses
  (``Q_batch_size = 1``, ``num_pre_Q = 8``; a group its filter skips is no step), and its DeepSpeed config
  accumulates 2 steps per AdamW update: its 20 head steps are 10 updates on 20 prompts, its 40 policy steps 20 on
  40. Here a step is verl's batch (``data.train_batch_size`` prompts x ``rollout.n``), trained in
  ``train_batch_size / ppo_mini_batch_size`` updates (x ``ppo_epochs``), and ``head_steps`` / ``policy_steps``
  count those steps: the source's updates a phase at one update a step are ``head_steps=10``,
  ``policy_steps=[20,20,10]``.
- **Its reward has four levels**: +-1 for the answer's last number against GSM8K's, plus 1.25 / -1 for the format
  ``<think>...</think><answer>...</answer>``: 2.25, 0.25, 0, -2. Rarity counts equal rewards, so its signal is
  made of those levels; here the reward is the run's (the recipe's math reward: 0/1). On 0/1 rewards rarity
  rewards the minority: with 6 of 8 right, s = 1/6 on the right answers and 1/2 on the wrong, mean 1/4, sample
  std 1/sqrt(42), A = -sqrt(42)/12 = -0.540 on the right and +sqrt(42)/4 = +1.620 on the wrong: the head phase
  pushes pi_roll toward wrong answers in every group more than half right (toward right ones below half). The
  source's reward does the same in a group whose answers share their format (2.25 and 0.25).
- **It samples at temperature 0.9** and takes its log-probs at 1. Here the rollout samples at
  ``actor_rollout_ref.rollout.temperature`` (verl's 1.0 unless set) and verl takes the actor's log-probs at that
  same temperature, so that the ratio is of the distribution sampled; ``rollout.temperature=0.9`` samples as the
  source (with log-probs at 0.9).
- **Its answers lose the end token**: it decodes each completion, deletes ``<|endoftext|>`` and ``<|im_end|>`` and
  tokenises the text again, so it never trains the end token (and a re-tokenised answer may not be the ids
  sampled). Here the ids sampled are trained, end token included: the rollout's log-probs are of those ids.
"""

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
