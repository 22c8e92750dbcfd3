"""Settings of the APO advantage estimator, read from verl's ``algorithm.apo`` config node.

Every setting has its default here, in code, so plain ``python -m verl.trainer.main_ppo
algorithm.adv_estimator=apo`` works without a single ``algorithm.apo`` key. With plain verl, add or change
one with ``+algorithm.apo.<key>=<value>`` (verl's yaml does not declare the node); the recipe's own config
(``conf/``) declares it, so there the ``+`` is not needed.

Paper symbols (APO paper, sections 4.4-4.5 and table 4.9) and their names here:

======================  ==================  =====================================================
paper                   setting             meaning
======================  ==================  =====================================================
lambda_scale            ``lambda_scale``    scale of the difficulty weight Phi_i
eta                     ``eta``             anchor rate scale: eta_t = clip(eta * std(H), eta_min, 1)
(not in the paper)      ``eta_min``         floor on eta_t; 0 gives the paper's literal rule
m                       ``history``         length of the anchor history H
C_0                     ``anchor_init``     the anchor's start value; ``null`` = first batch's y_t
s(.)                    ``success``         how a reward R_i maps to a success s_i in [0, 1]
======================  ==================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from recipe_apo.methods.checks import check_choice, check_flag, check_integer, check_number
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.settings import read_settings

SUCCESS_MODES = ("binary", "threshold", "minmax")
# Upper bounds far beyond the paper's ranges (lambda_scale 1.1-2.0, m 10-50), there so that no accepted value
# overflows: a lambda_scale of 1e308 makes every advantage inf, a history of 1e20 cannot be a deque length.
MAX_LAMBDA_SCALE = 1e3
MAX_HISTORY = 100_000
ANCHOR_SCOPES = ("global", "data_source")
ON_MISSING_STATE = ("error", "fresh")
ANCHOR_ORDERS = ("paper", "prior")


class ApoConfigError(MethodConfigError):
    """A setting under ``algorithm.apo`` is invalid; the message names the key."""


@dataclass(frozen=True)
class ApoSettings:
    """The ``algorithm.apo`` settings, validated. Defaults follow the paper's table 4.9."""

    # Phi_i = lambda_scale * exp(D_i * |Delta|). Paper range 1.1-2.0. It multiplies every advantage alike,
    # so beside an adaptive optimizer it acts mostly as a learning-rate factor; the reallocation between
    # hard and easy prompts comes from exp(D_i * |Delta|).
    lambda_scale: float = 1.5
    # eta in eta_t = clip(eta * std(H), eta_min, 1). Paper range 0.1-2.0.
    eta: float = 1.0
    # Floor on eta_t. The paper's rule alone (eta_min = 0) never moves an anchor whose history holds one
    # value: std(H) = 0, so eta_t = 0 forever. The floor makes the anchor an EMA of the batch success rate
    # with time constant <= 1/eta_min steps, and std(H) speeds it up while it is moving.
    eta_min: float = 0.05
    # m, the length of the history H of anchor values. Paper range 10-50.
    history: int = 20
    # C_0. None: warm start, C_0 = y_1, the first batch's success rate.
    anchor_init: Optional[float] = None
    # s(R): "binary" uses rewards as they are (they must lie in [0, 1], e.g. verl's gsm8k / math scores);
    # "threshold": s = 1 if R > success_threshold else 0 (verl's +1/-1 `math_dapo` rewards: threshold 0);
    # "minmax": s = (R - success_min) / (success_max - success_min), rewards must lie in that range.
    success: str = "binary"
    success_threshold: float = 0.5
    success_min: float = 0.0
    success_max: float = 1.0
    # False turns the difficulty reweighting off: advantages are then R_i - mean_g(R), exactly verl's
    # `grpo` with norm_adv_by_std_in_grpo=False (Dr. GRPO) for groups of 2 or more, while the anchor is still
    # tracked and logged.
    reweight: bool = True
    # "global": one anchor for the whole batch. "data_source": one anchor per data_source of the batch, for
    # training mixes whose sources differ in difficulty (the paper's first stated limitation). verl does not
    # pass data sources to estimators: this needs the recipe's trainer (`python -m recipe_apo.main`).
    anchor_scope: str = "global"
    # On resume, when the checkpoint's apo_state.json is missing, unreadable, or holds anchors of the other
    # scope: "error" stops the resume naming the file and the cause (a long run must not lose its anchor
    # unnoticed); "fresh" starts the anchor from anchor_init instead, with a warning.
    on_missing_state: str = "error"
    # Which anchor a step's groups are measured against. "paper": the APO paper's algorithm summary (4.8), the
    # anchor updated with this step's success rate, C_{t+1}. "prior": the anchor before this step's update,
    # C_t (HA-DW's C_t^-, "Your Group-Relative Advantage Is Biased", arXiv 2601.08521), so a step's groups are
    # not measured against their own success rate; with anchor_init null the first step's prior is its own
    # success rate (HA-DW's warm start).
    anchor_order: str = "paper"

    def __post_init__(self) -> None:
        _check_number("lambda_scale", self.lambda_scale, low=0.0, low_open=True, high=MAX_LAMBDA_SCALE)
        _check_number("eta", self.eta, low=0.0)
        _check_number("eta_min", self.eta_min, low=0.0, high=1.0)
        check_integer("algorithm.apo.history", self.history, ApoConfigError, low=1, high=MAX_HISTORY)
        if self.anchor_init is not None:
            _check_number("anchor_init", self.anchor_init, low=0.0, high=1.0)
        check_choice("algorithm.apo.success", self.success, SUCCESS_MODES, ApoConfigError)
        _check_number("success_threshold", self.success_threshold)
        _check_number("success_min", self.success_min)
        _check_number("success_max", self.success_max)
        if self.success == "minmax" and not self.success_max > self.success_min:
            raise ApoConfigError(
                "algorithm.apo.success_max must be greater than algorithm.apo.success_min for success=minmax, "
                f"got min={self.success_min!r}, max={self.success_max!r}"
            )
        check_flag("algorithm.apo.reweight", self.reweight, ApoConfigError)
        check_choice("algorithm.apo.anchor_scope", self.anchor_scope, ANCHOR_SCOPES, ApoConfigError)
        check_choice("algorithm.apo.anchor_order", self.anchor_order, ANCHOR_ORDERS, ApoConfigError)
        check_choice("algorithm.apo.on_missing_state", self.on_missing_state, ON_MISSING_STATE, ApoConfigError)

    @classmethod
    def from_algorithm_config(cls, algorithm_config: Any) -> "ApoSettings":
        """Read ``algorithm_config.apo`` (an OmegaConf node, a dict, or absent) into settings.

        An unknown key is refused, so a typo such as ``lambda_sacle`` cannot pass unnoticed.
        """
        return read_settings(cls, algorithm_config, "apo", ApoConfigError)


def _check_number(
    key: str,
    value: Any,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_open: bool = False,
) -> None:
    check_number(f"algorithm.apo.{key}", value, ApoConfigError, low=low, high=high, low_open=low_open)
