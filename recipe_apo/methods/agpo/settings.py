"""AGPO's settings, ``algorithm.agpo`` (the authors' values: verl pull request #2649 at 4cbea10,
``verl/workers/reward_manager/agpo.py``, ``core_algos.compute_agpo_outcome_advantage`` and the scorer of their
data, ``verl/utils/reward_score/math_dapo.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipe_apo.methods.checks import check_flag, check_number
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.settings import read_settings

# Far beyond the authors' 0.1: a bonus of this size already outweighs the reward it shapes a thousand times.
MAX_LENGTH_BONUS = 1e3
# The two reward scales: the authors' (math_dapo: +1 right, -1 wrong) and the rewards as they come (0 wrong).
WRONG_REWARDS = (-1, 0)


class AgpoConfigError(MethodConfigError):
    """A setting under ``algorithm.agpo`` is invalid; the message names the key."""


@dataclass(frozen=True)
class AgpoSettings:
    """The ``algorithm.agpo`` settings, each checked for its type and bounds."""

    # b in the training reward of a correct response (reward exactly 1) of a group that is not all correct and
    # whose correct responses differ in length: 1 + b (1 - (L - L_min) / (L_max - L_min)), over the group's
    # correct responses (the shortest 1 + b, the longest 1). The authors' 0.1; 0 turns the bonus off.
    length_bonus: float = 0.1
    # A group whose rewards are all 1 gets advantage +1 on every response, all 0 gets -1 (the authors' rule: such
    # a group is not left without a signal). false: GRPO's 0 for them. With wrong_reward=-1 (the authors' scale)
    # no group is all 0, so only the +1 can act; with verl's group filter on (the preset) no such group reaches
    # the estimator at all.
    saturated_signal: bool = True
    # What a wrong answer (a reward other than exactly 1) trains on, before the length bonus and the estimator.
    # -1 (the authors'): their data (data_source math_agpo) was scored by verl's math_dapo, +1 right and -1 wrong,
    # so every reward other than 1 becomes -1: an all-wrong group then has mean -1 and std 0, so A = 0 (the loss
    # mask drops it) and the -1 of saturated_signal never fires; the bonus b weighs half what it weighs on 0/1
    # rewards (1 + b u on -1/+1 is 2 (1 + b u / 2) - 1). 0: the rewards as the scorer gives them (0/1: wrong is 0,
    # an all-wrong group gets -1 with the filter off; a partial reward stays itself). docs/agpo.md argues the default.
    wrong_reward: int = -1

    def __post_init__(self) -> None:
        check_number("algorithm.agpo.length_bonus", self.length_bonus, AgpoConfigError, low=0.0,
                     high=MAX_LENGTH_BONUS)
        check_flag("algorithm.agpo.saturated_signal", self.saturated_signal, AgpoConfigError)
        # bool before the test: Python's false equals 0, and a flag here is a typo, not a reward scale.
        if isinstance(self.wrong_reward, bool) or self.wrong_reward not in WRONG_REWARDS:
            raise AgpoConfigError(f"algorithm.agpo.wrong_reward must be -1 (the authors' math_dapo scale) or 0 (the "
                                  f"rewards as scored), got {self.wrong_reward!r}")

    @classmethod
    def from_algorithm_config(cls, algorithm_config: Any) -> "AgpoSettings":
        """Read ``algorithm_config.agpo`` (an OmegaConf node, a dict, or absent); unknown keys are refused."""
        return read_settings(cls, algorithm_config, "agpo", AgpoConfigError)
