"""AGPO's training rewards and advantages, as its authors built them (verl pull request #2649 at 4cbea10:
``verl/workers/reward_manager/agpo.py`` and ``core_algos.compute_agpo_outcome_advantage``, on the rewards of
their scorer, ``verl/utils/reward_score/math_dapo.py``).

Symbols, for response i of prompt group g (verl's uid):

- R_i: the response's reward, the sum of its token-level rewards; it is *correct* when R_i is exactly 1 (the
  authors' test); L_i: its length in tokens (the sum of its response mask);
- S_i, its score on the training scale w (``algorithm.agpo.wrong_reward``): with w = -1 (the default, the
  authors' math_dapo: +1 right, -1 wrong) S_i is 1 if R_i is exactly 1, else -1; with w = 0 S_i = R_i as handed;
- R~_i, the training reward, with the length bonus b (``algorithm.agpo.length_bonus``, 0.1): in a group that is
  not all correct and whose correct responses differ in length, a correct response gets
  1 + b (1 - (L_i - L_min) / (L_max - L_min)), L_min and L_max over the group's correct responses (the shortest
  1 + b, the longest 1); every other response keeps S_i. On 0/1 rewards, R~ at w = -1 is 2 R~' - 1 with R~' the
  training reward at w = 0 and b / 2: the gap between right and wrong is 2, so b weighs half as much;
- A_i: +1 on every response of a group whose R~ are all 1, -1 all 0 (``saturated_signal``), otherwise GRPO's
  (R~_i - mean_g) / (std_g + 1e-6) (sample std, n - 1), or R~_i - mean_g without std normalization; a group of
  one has mean 0 and std 1. With w = -1 no group is all 0: an all-wrong group is all -1, its A is GRPO's 0 and
  the loss's A != 0 mask drops it, as in the authors' runs. So on 0/1 rewards with std normalization, w = -1 is
  w = 0 at b / 2 except in all-wrong groups (0, not -1), groups of one (a wrong answer -1, not 0) and in the last
  bits (the 1e-6 meets a doubled std). Every token of a response gets its A_i.

Where this departs from the authors' code, and why:

- the length bonus is applied here, to the rewards the estimator is handed, not by a reward manager: verl 0.9.1
  scores in its reward loop, per response, where no group is in sight. The advantages are the same; verl's logged
  ``critic/score/*`` is the unshaped reward (the authors' logs showed the shaped one, here ``agpo/shaped_reward_mean``),
  and validation, which computes no advantage, is untouched as in the authors' code;
- groups are verl's uids; the authors' reward manager grouped by the decoded prompt text, which joins two draws of
  one prompt in a batch into one group;
- the -1/+1 scale is applied here, to the rewards the estimator is handed (w = -1), not by the scorer: the recipe
  keeps verl's 0/1 scorers (the group filter, ``critic/score/*`` and validation read 0/1 rewards); the estimator
  sees what the authors' estimator saw;
- rows without a valid token (verl's padding) take no part in any statistic and get A = 0 (the authors' code has
  none); statistics in float64, rounded once to the rewards' dtype (the authors': float32 throughout, so the two
  differ in the last bits).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.methods import driver_state
from recipe_apo.methods.agpo import ESTIMATOR, METHOD
from recipe_apo.methods.agpo.settings import AgpoSettings
from recipe_apo.methods.checks import check_advantages, check_finite, check_mask, check_shapes, output_dtype
from recipe_apo.methods.errors import BatchInputError, MethodConfigError
from recipe_apo.methods.groups import centered_rewards, group_ids, group_range, response_rewards
from recipe_apo.methods.settings import read_flag
from recipe_apo.methods.tensors import from_float64, to_numpy

EPSILON = 1e-6


def shaped_rewards(scores: np.ndarray, lengths: np.ndarray, codes: np.ndarray, n_groups: int, valid: np.ndarray,
                   length_bonus: float) -> tuple[np.ndarray, np.ndarray]:
    """(R~, which rows got a bonus): the training rewards with the length bonus (the module's docstring), float64.

    The bonus is computed in float64 and rounded to float32, as the authors' Python floats became a float32 tensor
    that multiplied their float32 rewards."""
    correct = valid & (scores == 1.0)
    counts = np.bincount(codes, weights=valid, minlength=n_groups)
    n_correct = np.bincount(codes, weights=correct, minlength=n_groups)
    shortest, longest = group_range(codes[correct], n_groups, lengths[correct])
    spread = longest - shortest
    shaped_group = (n_correct > 0) & (n_correct < counts) & (spread > 0) & (length_bonus > 0)
    bonused = correct & shaped_group[codes]
    ratio = np.divide(lengths - shortest[codes], spread[codes], out=np.zeros_like(lengths), where=bonused)
    factor = (1.0 + length_bonus * (1.0 - ratio)).astype(np.float32).astype(np.float64)
    return np.where(bonused, scores * factor, scores), bonused


def saturated_groups(shaped: np.ndarray, codes: np.ndarray, n_groups: int, valid: np.ndarray,
                     counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(all 1, all 0) per group of two or more valid responses: the groups the authors' rule gives +1 and -1."""
    low, high = group_range(codes[valid], n_groups, shaped[valid])
    same = (counts > 1) & (low == high)
    return same & (high == 1.0), same & (high == 0.0)


def compute_agpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    norm_adv_by_std: bool = True,
    settings: Optional[AgpoSettings] = None,
) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """AGPO's advantages (batch, response_len), in the rewards' dtype (float32 for integer rewards), and the per-row
    arrays behind them: ``shaped`` R~ on the ``wrong_reward`` scale (float64), ``bonused`` (bool), ``saturated``
    (+1, -1 or 0 per row)."""
    settings = settings or AgpoSettings()
    check_shapes(token_level_rewards=token_level_rewards, response_mask=response_mask)
    check_mask(response_mask, prefix="agpo: ")
    batch_size = token_level_rewards.shape[0]
    out_dtype = output_dtype(token_level_rewards)
    codes, n_groups = group_ids(index, batch_size)
    mask = torch.empty_like(response_mask, dtype=torch.float32).copy_(response_mask.detach())
    lengths = to_numpy(mask.sum(dim=-1)).astype(np.float64)  # exact: counts far below 2^24
    valid = lengths > 0
    scores = response_rewards(token_level_rewards)
    check_finite(scores, valid, "rewards", prefix="agpo")
    if settings.wrong_reward == -1:
        scores = np.where(valid & (scores != 1.0), -1.0, scores)  # math_dapo's scale: right 1, anything else -1

    shaped, bonused = shaped_rewards(scores, lengths, codes, n_groups, valid, settings.length_bonus)
    w = valid.astype(np.float64)
    counts = np.bincount(codes, weights=w, minlength=n_groups)
    advantage = centered_rewards(shaped, w, codes, counts, norm_adv_by_std, EPSILON)
    saturated = np.zeros(batch_size)
    if settings.saturated_signal:
        all_one, all_zero = saturated_groups(shaped, codes, n_groups, valid, counts)
        saturated = np.where(all_one[codes], 1.0, np.where(all_zero[codes], -1.0, 0.0))
        advantage = np.where(saturated != 0, saturated, advantage)
    advantage = np.where(valid, advantage, 0.0)
    check_advantages("agpo", advantage, out_dtype, "rescale the rewards (algorithm.agpo.wrong_reward=0 keeps their "
                     "scale; without norm_adv_by_std_in_grpo the advantages are reward differences)")
    out = mask if out_dtype == torch.float32 else torch.empty_like(response_mask, dtype=out_dtype).copy_(response_mask)
    advantages = out.mul_(from_float64(advantage, out_dtype, out.device).unsqueeze(-1))
    return advantages, {"shaped": np.where(valid, shaped, 0.0), "bonused": bonused, "saturated": saturated}


@METHOD.estimator(ESTIMATOR, reads_std_norm=True)
def agpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=agpo``; returns (advantages, returns)."""
    settings = AgpoSettings.from_algorithm_config(config)
    if index is None:
        raise BatchInputError("the agpo estimator needs the uid of each response (non_tensor_batch['uid'])")
    norm = read_flag(config, "norm_adv_by_std_in_grpo", True, MethodConfigError)
    advantages, rows = compute_agpo_advantage(token_level_rewards, response_mask, index, norm, settings)
    # The training rewards behind the advantages, for the runtime's metrics and dump (the recipe's trainer).
    driver_state.record_result("agpo", {}, valid=to_numpy(response_mask.sum(dim=-1, dtype=torch.float32)) > 0, **rows)
    return advantages, advantages
