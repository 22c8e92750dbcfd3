"""Where a batch of rollouts puts its learning signal: the group statistics of the bias audit and of the CPU
testbed.

One module for both tools, so a number means the same in a report of a real run (``python -m recipe_apo.audit``)
and in the testbed's (``recipe_apo.testbed``); group ids and per-group sums come from
``recipe_apo.methods.groups``, a method's advantages to feed them from ``recipe_apo.integration.replay``.
Symbols of the APO paper, for response i of prompt group g:

- G: responses per group; R_i: the response's score; s_i: its success in [0, 1] (``recipe_apo.methods.apo.success``);
- p_hat_g: the group's success rate; a group is *dead* when every response scored the same: its centered
  rewards, and so its advantages under GRPO, Dr. GRPO and APO, are all 0;
- A_i: the advantage a method's estimator returns (verl's ``compute_advantage``, on every token alike);
- S+_g = sum_i max(A_i, 0) and S-_g = sum_i max(-A_i, 0): the group's positive and negative signal; for centered
  binary rewards E[S+] = p (1 - p) (G - 1) (Proposition 1, ``closed_form``);
- |o_i|: the response's length; L0: the constant of ``seq-mean-token-sum-norm``;
- per-token weight w_i of a response under its method's aggregation, up to the mini-batch's constant:
  ``seq-mean-token-mean`` (GRPO) 1 / |o_i|, ``seq-mean-token-sum-norm`` (Dr. GRPO, APO) 1 / L0, ``token-mean``
  (AGPO, CoDaPO) 1;
- update mass m_i = |A_i| |o_i| w_i: how much of the step's update the response's tokens carry together.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from recipe_apo.methods.checks import NORM_MODE
from recipe_apo.methods.groups import group_ids, group_range, group_sums

TOKEN_MEAN = "seq-mean-token-mean"
TOKEN_SUM_NORM = NORM_MODE
BATCH_TOKEN_MEAN = "token-mean"
# The aggregations ``token_weights`` has a per-token weight rule for.
WEIGHT_RULES = (TOKEN_MEAN, TOKEN_SUM_NORM, BATCH_TOKEN_MEAN)


def dead_groups(scores: Any, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group: every response scored the same (no signal under any centered method)."""
    low, high = group_range(codes, n_groups, scores)
    return low == high


def live_rows(scores: np.ndarray, valid: np.ndarray, index: Any,
              outcome_rows: Optional[np.ndarray] = None) -> np.ndarray:
    """Per response: does its group have at least two distinct rewards among its valid responses?

    Compared by min and max (``groups.group_range``). Padding rows (``valid`` false) are never live. With
    ``outcome_rows`` (bool per row: the row holds its trajectory's outcome) only those rows' rewards decide, and
    every valid row of a live group is live.
    """
    codes, n_groups = group_ids(index, scores.shape[0])
    deciding = valid if outcome_rows is None else valid & np.asarray(outcome_rows, dtype=bool)
    low, high = group_range(codes[deciding], n_groups, scores[deciding])
    return valid & (high > low)[codes]


def signal_per_group(advantages: Any, codes: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(S+_g, S-_g): the sums of a group's positive and of its negative advantages (both >= 0)."""
    advantages = np.asarray(advantages, dtype=np.float64)
    return (group_sums(codes, n_groups, np.clip(advantages, 0.0, None)),
            group_sums(codes, n_groups, np.clip(-advantages, 0.0, None)))


def closed_form(p: Any, group_size: int) -> np.ndarray:
    """E[S+] of centered, unnormalized binary rewards with success probability p: p (1 - p) (G - 1)."""
    p = np.asarray(p, dtype=np.float64)
    return p * (1.0 - p) * (group_size - 1)


def length_by_outcome(lengths: Any, correct: Any) -> tuple[float, float]:
    """(mean length of correct responses, of incorrect ones); NaN where there are none."""
    lengths = np.asarray(lengths, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    right = float(lengths[correct].mean()) if correct.any() else float("nan")
    wrong = float(lengths[~correct].mean()) if (~correct).any() else float("nan")
    return right, wrong


def token_weights(lengths: Any, loss_agg_mode: str, l0: float) -> np.ndarray:
    """Per-token weight w_i of each response under ``loss_agg_mode`` (up to the mini-batch's constant)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if loss_agg_mode == TOKEN_MEAN:
        return 1.0 / np.maximum(lengths, 1.0)
    if loss_agg_mode == TOKEN_SUM_NORM:
        return np.full_like(lengths, 1.0 / float(l0))
    if loss_agg_mode == BATCH_TOKEN_MEAN:
        # 1 / T, T the mini-batch's tokens: every token alike, a constant the weights are taken up to.
        return np.ones_like(lengths)
    raise ValueError(f"no per-token weight rule for loss_agg_mode={loss_agg_mode!r}")


def update_mass(advantages: Any, lengths: Any, loss_agg_mode: str, l0: float) -> np.ndarray:
    """m_i = |A_i| |o_i| w_i, each response's share of the update before normalizing over the step."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return np.abs(np.asarray(advantages, dtype=np.float64)) * lengths * token_weights(lengths, loss_agg_mode, l0)
