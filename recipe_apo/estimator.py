"""The APO advantage estimator (APO paper, sections 4.3-4.5 and the algorithm summary of 4.8).

Paper symbols and their names here, for response i of prompt group g:

- R_i: ``scores``, the sum of the response's token-level rewards.
- A_i = R_i - mean_g(R): ``centered``, the group-centered reward with no std normalization.
- s_i = s(R_i) in [0, 1]: ``success`` (see ``recipe_apo.success``).
- p_hat_g = mean_g(s): ``group_success``.
- y_t = mean of s over the batch: ``batch_success``.
- C_t: the capability anchor (``recipe_apo.anchor``).
- Delta_g = p_hat_g - C_t: ``gap``; the group is harder than the model when Delta_g < 0.
- D_i = -sign(A_i) sign(Delta_g), Phi_i = lambda_scale * exp(D_i |Delta_g|): ``weight``.
- A_i^eff = Phi_i A_i: the returned advantage, on every valid token, 0 on padding.

Order within a step follows the paper's algorithm summary: the anchor is first updated with this batch's y_t,
then Delta_g is measured against the updated anchor C_{t+1}.

Everything is vectorized over the batch: group ids come from one hashed pass over the uid array
(``pandas.factorize``), group sums from ``index_add``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pandas as pd
import torch

from recipe_apo.anchor import CapabilityAnchor, get_driver_anchor
from recipe_apo.settings import ApoSettings
from recipe_apo.success import ApoInputError, success_of

__all__ = ["ApoInputError", "apo_outcome_advantage", "compute_apo_advantage", "group_ids"]


def group_ids(index: Any, batch_size: int) -> tuple[torch.Tensor, int]:
    """Contiguous group ids 0..n_groups-1 (first-seen order) for the per-response uid array ``index``."""
    labels = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    if labels.ndim != 1 or labels.shape[0] != batch_size:
        raise ApoInputError(
            f"index (the uid array) has shape {tuple(labels.shape)} but the batch has {batch_size} responses; "
            "pass one uid per response"
        )
    codes, uniques = pd.factorize(labels)
    if batch_size and codes.min() < 0:
        rows = np.flatnonzero(codes < 0)
        raise ApoInputError(f"index (the uid array) has {rows.size} missing uids, first rows {rows[:5].tolist()}")
    return torch.from_numpy(codes.astype(np.int64, copy=False)), len(uniques)


def compute_apo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    settings: ApoSettings,
    anchor: CapabilityAnchor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """APO advantages A_i^eff of shape (batch, response_len), and this step's anchor metrics.

    The anchor is the only state touched, and only after every check on the batch has passed: a bad batch
    raises ``ApoInputError`` and leaves the anchor as it was.
    """
    if token_level_rewards.dim() != 2 or response_mask.shape != token_level_rewards.shape:
        raise ApoInputError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (batch, response_len)"
        )
    batch_size = token_level_rewards.shape[0]
    device = token_level_rewards.device
    scores = token_level_rewards.sum(dim=-1).to(torch.float64)
    finite = torch.isfinite(scores)
    if not bool(finite.all()):
        rows = torch.nonzero(~finite).flatten()
        raise ApoInputError(
            f"token_level_rewards: {rows.numel()} of {batch_size} responses have NaN/inf rewards, "
            f"first rows {rows[:5].tolist()}"
        )
    success = success_of(scores, settings)
    codes, n_groups = group_ids(index, batch_size)
    if batch_size == 0:
        return torch.zeros_like(token_level_rewards), {}
    codes = codes.to(device)

    counts = torch.zeros(n_groups, dtype=torch.float64, device=device).index_add_(0, codes, torch.ones_like(scores))
    group_mean = torch.zeros_like(counts).index_add_(0, codes, scores) / counts
    centered = scores - group_mean[codes]
    group_success = torch.zeros_like(counts).index_add_(0, codes, success) / counts
    batch_success = float(success.mean())

    anchor_value, rate = anchor.update(batch_success, settings.eta, settings.eta_min, settings.history)

    gap = group_success - anchor_value
    if settings.reweight:
        direction = -torch.sign(centered) * torch.sign(gap)[codes]
        weight = settings.lambda_scale * torch.exp(direction * gap.abs()[codes])
    else:
        weight = torch.ones_like(centered)
    scalar = (weight * centered).to(token_level_rewards.dtype)
    advantages = scalar.unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)

    signal_per_group = torch.zeros_like(counts).index_add_(0, codes, (centered != 0).to(torch.float64))
    metrics = {
        "apo/anchor": anchor_value,
        "apo/anchor_rate": rate,
        "apo/batch_success": batch_success,
        "apo/harder_group_share": float((gap < 0).to(torch.float64).mean()),
        "apo/uniform_group_share": float((signal_per_group == 0).to(torch.float64).mean()),
    }
    positive, negative = centered > 0, centered < 0
    if bool(positive.any()):
        metrics["apo/weight_pos_mean"] = float(weight[positive].mean())
    if bool(negative.any()):
        metrics["apo/weight_neg_mean"] = float(weight[negative].mean())
    anchor.last_metrics = metrics
    return advantages, metrics


def apo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=apo``; returns (advantages, returns).

    ``config`` is verl's ``algorithm`` config node; settings come from its ``apo`` child. The anchor is the
    driver process's (``recipe_apo.anchor.get_driver_anchor``); its metrics of the step are left on
    ``anchor.last_metrics`` for the trainer to log.
    """
    settings = ApoSettings.from_algorithm_config(config)
    if index is None:
        raise ApoInputError("the apo estimator needs the uid of each response (non_tensor_batch['uid'])")
    anchor = get_driver_anchor(init=settings.anchor_init, history=settings.history)
    advantages, _metrics = compute_apo_advantage(token_level_rewards, response_mask, index, settings, anchor)
    return advantages, advantages
