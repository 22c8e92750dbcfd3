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

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import numpy as np
import pandas as pd
import torch

from recipe_apo.anchor import GLOBAL_SCOPE, AnchorBook, CapabilityAnchor, driver_anchors
from recipe_apo.settings import ApoSettings
from recipe_apo.success import ApoInputError, success_of

__all__ = ["ApoInputError", "apo_outcome_advantage", "batch_scopes", "compute_apo_advantage", "group_ids"]


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


def _group_scopes(scope_codes: torch.Tensor, codes: torch.Tensor, n_groups: int, index: Any) -> torch.Tensor:
    """The scope of each group; a group whose responses come from different scopes is refused."""
    low = torch.full((n_groups,), torch.iinfo(torch.int64).max, dtype=torch.int64)
    high = torch.full((n_groups,), -1, dtype=torch.int64)
    low = low.scatter_reduce(0, codes, scope_codes, reduce="amin")
    high = high.scatter_reduce(0, codes, scope_codes, reduce="amax")
    mixed = torch.nonzero(low != high).flatten()
    if mixed.numel():
        first = int(torch.nonzero(codes == mixed[0]).flatten()[0])
        raise ApoInputError(
            f"{mixed.numel()} prompt groups mix data sources (e.g. uid {np.asarray(index)[first]!r}); "
            "algorithm.apo.anchor_scope=data_source needs one data_source per uid"
        )
    return low


def compute_apo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    settings: ApoSettings,
    anchors: AnchorBook | CapabilityAnchor,
    scopes: Optional[Any] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """APO advantages A_i^eff of shape (batch, response_len), and this step's anchor metrics.

    ``anchors`` is one anchor for the whole batch, or a book of anchors by scope; with ``scopes`` (one name per
    response, e.g. its ``data_source``) each scope's anchor is updated with that scope's success rate and
    measures the groups of that scope. The anchors are the only state touched, and only after every check on
    the batch has passed: a bad batch raises ``ApoInputError`` and leaves them as they were.
    """
    if token_level_rewards.dim() != 2 or response_mask.shape != token_level_rewards.shape:
        raise ApoInputError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (batch, response_len)"
        )
    if scopes is not None and isinstance(anchors, CapabilityAnchor):
        raise ApoInputError("per-scope anchors need an AnchorBook, not a single CapabilityAnchor")
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
    if scopes is None:
        scope_codes, scope_names = torch.zeros(batch_size, dtype=torch.int64), [GLOBAL_SCOPE]
    else:
        scope_labels = np.asarray(scopes, dtype=object)
        if scope_labels.shape != (batch_size,):
            raise ApoInputError(
                f"data sources: got {scope_labels.shape[0] if scope_labels.ndim else 0} for {batch_size} responses"
            )
        raw_codes, uniques = pd.factorize(scope_labels)
        scope_codes, scope_names = torch.from_numpy(raw_codes.astype(np.int64)), [str(u) for u in uniques]
    if batch_size == 0:
        return torch.zeros_like(token_level_rewards), {}
    group_scope = _group_scopes(scope_codes, codes, n_groups, index) if scopes is not None else None
    codes, scope_codes = codes.to(device), scope_codes.to(device)

    counts = torch.zeros(n_groups, dtype=torch.float64, device=device).index_add_(0, codes, torch.ones_like(scores))
    group_mean = torch.zeros_like(counts).index_add_(0, codes, scores) / counts
    centered = scores - group_mean[codes]
    group_success = torch.zeros_like(counts).index_add_(0, codes, success) / counts

    n_scopes = len(scope_names)
    scope_counts = torch.zeros(n_scopes, dtype=torch.float64, device=device).index_add_(
        0, scope_codes, torch.ones_like(scores)
    )
    scope_success = (
        torch.zeros_like(scope_counts).index_add_(0, scope_codes, success) / scope_counts
    ).tolist()
    anchor_of = (lambda name: anchors) if isinstance(anchors, CapabilityAnchor) else anchors.anchor
    values, rates = [], []
    for name, batch_success in zip(scope_names, scope_success):
        value, rate = anchor_of(name).update(batch_success, settings.eta, settings.eta_min, settings.history)
        values.append(value)
        rates.append(rate)

    if group_scope is None:
        group_anchor = torch.full((n_groups,), values[0], dtype=torch.float64, device=device)
    else:
        group_anchor = torch.tensor(values, dtype=torch.float64, device=device)[group_scope.to(device)]
    gap = group_success - group_anchor
    if settings.reweight:
        direction = -torch.sign(centered) * torch.sign(gap)[codes]
        weight = settings.lambda_scale * torch.exp(direction * gap.abs()[codes])
    else:
        weight = torch.ones_like(centered)
    scalar = (weight * centered).to(token_level_rewards.dtype)
    advantages = scalar.unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)

    signal_per_group = torch.zeros_like(counts).index_add_(0, codes, (centered != 0).to(torch.float64))
    metrics = {
        "apo/batch_success": float(success.mean()),
        "apo/harder_group_share": float((gap < 0).to(torch.float64).mean()),
        "apo/uniform_group_share": float((signal_per_group == 0).to(torch.float64).mean()),
    }
    if scopes is None:
        metrics.update({"apo/anchor": values[0], "apo/anchor_rate": rates[0]})
    else:
        for name, value, rate, batch_success in zip(scope_names, values, rates, scope_success):
            metrics.update({
                f"apo/anchor/{name}": value,
                f"apo/anchor_rate/{name}": rate,
                f"apo/batch_success/{name}": batch_success,
            })
    positive, negative = centered > 0, centered < 0
    if bool(positive.any()):
        metrics["apo/weight_pos_mean"] = float(weight[positive].mean())
    if bool(negative.any()):
        metrics["apo/weight_neg_mean"] = float(weight[negative].mean())
    anchors.last_metrics = metrics
    return advantages, metrics


_handed_scopes: Optional[Any] = None


@contextmanager
def batch_scopes(scopes: Optional[Any]) -> Iterator[None]:
    """Hand the next estimator call the per-response scopes (data sources) that verl does not pass it.

    verl calls an estimator with rewards, mask and uids only; the recipe's trainer, which runs in the same
    driver process, wraps its advantage step in this context when ``algorithm.apo.anchor_scope=data_source``.
    """
    global _handed_scopes
    _handed_scopes = scopes
    try:
        yield
    finally:
        _handed_scopes = None


def apo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=apo``; returns (advantages, returns).

    ``config`` is verl's ``algorithm`` config node; settings come from its ``apo`` child. The anchors are the
    driver process's (``recipe_apo.anchor.driver_anchors``); the step's metrics are left on their
    ``last_metrics`` for the trainer to log.
    """
    settings = ApoSettings.from_algorithm_config(config)
    if index is None:
        raise ApoInputError("the apo estimator needs the uid of each response (non_tensor_batch['uid'])")
    scopes = None
    if settings.anchor_scope == "data_source":
        scopes = _handed_scopes
        if scopes is None:
            raise ApoInputError(
                "algorithm.apo.anchor_scope=data_source needs each response's data_source, which verl does not "
                "pass to estimators: train with `python -m recipe_apo.main` (trainer.v1.trainer_mode=apo_sync)"
            )
    book = driver_anchors(init=settings.anchor_init, history=settings.history)
    advantages, _metrics = compute_apo_advantage(token_level_rewards, response_mask, index, settings, book, scopes)
    return advantages, advantages
