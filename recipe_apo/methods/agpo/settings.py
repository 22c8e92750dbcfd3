"""AGPO's settings, ``algorithm.agpo`` (the authors' values: verl pull request #2649 at 4cbea10,
``verl/workers/reward_manager/agpo.py`` and ``core_algos.compute_agpo_outcome_advantage``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recipe_apo.methods.checks import check_flag, check_number
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.settings import read_settings

# Far beyond the authors' 0.1: a bonus of this size already outweighs the reward it shapes a thousand times.
MAX_LENGTH_BONUS = 1e3


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
    # a group is not left without a signal). false: GRPO's 0 for them. With verl's group filter on (the preset),
    # no such group reaches the estimator.
    saturated_signal: bool = True

    def __post_init__(self) -> None:
        check_number("algorithm.agpo.length_bonus", self.length_bonus, AgpoConfigError, low=0.0,
                     high=MAX_LENGTH_BONUS)
        check_flag("algorithm.agpo.saturated_signal", self.saturated_signal, AgpoConfigError)

    @classmethod
    def from_algorithm_config(cls, algorithm_config: Any) -> "AgpoSettings":
        """Read ``algorithm_config.agpo`` (an OmegaConf node, a dict, or absent); unknown keys are refused."""
        return read_settings(cls, algorithm_config, "agpo", AgpoConfigError)
