"""The APO advantage estimator (APO paper, sections 4.3-4.5 and the algorithm summary of 4.8).

Paper symbols and their names here, for response i of prompt group g:

- R_i: ``scores``, the sum of the response's token-level rewards.
- A_i = R_i - mean_g(R): ``centered``, the group-centered reward with no std normalization.
- s_i = s(R_i) in [0, 1]: ``success`` (see ``recipe_apo.methods.success``).
- p_hat_g = mean_g(s): ``group_success``.
- y_t = mean of s over the batch: ``batch_success``.
- C_t: the capability anchor (``recipe_apo.methods.anchor``).
- Delta_g = p_hat_g - C_t: ``gap``; the group is harder than the model when Delta_g < 0.
- D_i = -sign(A_i) sign(Delta_g), Phi_i = lambda_scale * exp(D_i |Delta_g|): ``weight``.
- A_i^eff = Phi_i A_i: the returned advantage, on every valid token, 0 on padding.

Order within a step follows the paper's algorithm summary: the anchor is first updated with this batch's y_t,
then Delta_g is measured against the updated anchor C_{t+1}.

Everything is vectorized over the batch: group ids come from one hashed pass over the uid array
(``pandas.factorize``: verl's uids are uuid strings, which hashing groups faster than ``np.unique``'s sort;
pandas is the one dependency of the maths beyond torch, numpy and verl), group sums from ``np.bincount``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import pandas as pd
import torch

from recipe_apo.methods.anchor import GLOBAL_SCOPE, AnchorBook, CapabilityAnchor, driver_anchors, handed_scopes
from recipe_apo.methods.apo_settings import ApoSettings
from recipe_apo.methods.success import ApoInputError, success_of

__all__ = ["ApoInputError", "apo_outcome_advantage", "compute_apo_advantage", "group_ids"]


def group_ids(index: Any, batch_size: int) -> tuple[np.ndarray, int]:
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
    return codes.astype(np.int64, copy=False), len(uniques)


def _group_scopes(scope_codes: np.ndarray, codes: np.ndarray, n_groups: int, index: Any) -> np.ndarray:
    """The scope of each group; a group whose responses come from different scopes is refused."""
    group_scope = np.zeros(n_groups, dtype=np.int64)
    group_scope[codes] = scope_codes
    mixed = np.flatnonzero(group_scope[codes] != scope_codes)
    if mixed.size:
        raise ApoInputError(
            f"{np.unique(codes[mixed]).size} prompt groups mix data sources (e.g. uid "
            f"{np.asarray(index)[mixed[0]]!r}); algorithm.apo.anchor_scope=data_source needs one data_source per uid"
        )
    return group_scope


def _group_mean(codes: np.ndarray, weighted_values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-group sums of already-weighted values over per-group counts; 0 for a group with no count."""
    sums = np.bincount(codes, weights=weighted_values, minlength=counts.size)
    return np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)


def response_rewards(token_level_rewards: torch.Tensor) -> np.ndarray:
    """R_i, float64: summed in the rewards' own dtype where that is exact enough (integers, bool, float32/64),
    in float32 for half precision (a float16 sum of a 3,000-token row would round). Not in float64 throughout:
    torch's upcasting sum is about 13x slower on (65,536 x 512) float32 rewards."""
    rewards = token_level_rewards.detach()
    if rewards.dtype in (torch.float16, torch.bfloat16):
        sums = rewards.sum(dim=-1, dtype=torch.float32)
    else:
        sums = rewards.sum(dim=-1)
    return sums.to(torch.float64).cpu().numpy()


def _check_no_overflow(centered: np.ndarray, settings: ApoSettings, dtype: torch.dtype) -> None:
    """Refuse, before any anchor moves, a batch whose advantages could leave ``dtype``'s range.

    |Delta_g| <= 1 (success rates and anchors lie in [0, 1]), so |A_i^eff| <= lambda_scale * e * |A_i|.
    """
    largest = float(np.abs(centered).max(initial=0.0))
    bound = largest * (settings.lambda_scale * math.e if settings.reweight else 1.0)
    limit = float(torch.finfo(dtype).max)
    if not bound <= limit:  # also catches inf and NaN
        raise ApoInputError(
            f"advantages would overflow {str(dtype).removeprefix('torch.')} (max {limit:.3g}): "
            f"algorithm.apo.lambda_scale={settings.lambda_scale:g} x e x the largest group-centered reward "
            f"{largest:.3g}; lower lambda_scale or rescale the rewards"
        )


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

    Per-response and per-group maths run in float64 numpy (a few dozen passes over vectors of batch size,
    where torch's per-op overhead dominates); the only tensor-sized work is the reward sum and one output.
    """
    if token_level_rewards.dim() != 2 or response_mask.shape != token_level_rewards.shape:
        raise ApoInputError(
            f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
            f"{tuple(response_mask.shape)} must both be (batch, response_len)"
        )
    if scopes is not None and isinstance(anchors, CapabilityAnchor):
        raise ApoInputError("per-scope anchors need an AnchorBook, not a single CapabilityAnchor")
    batch_size = token_level_rewards.shape[0]
    # Integer and boolean rewards are valid inputs (verl's own scorers return ints); the advantages are real
    # numbers whatever the rewards' dtype.
    out_dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    if batch_size == 0 or token_level_rewards.shape[1] == 0:
        # No response, or no token in any: nothing observed, the anchors stay as they are.
        group_ids(index, batch_size)
        return torch.zeros(token_level_rewards.shape, dtype=out_dtype, device=token_level_rewards.device), {}
    # Rows without a single valid token are padding (verl pads a batch to a divisible size with such rows, all
    # under one made-up uid): they take no part in group means, p_hat_g or y_t, and get advantage 0.
    # amax, not any: any() first converts the whole mask to bool, 3-6x slower on verl's int64 masks.
    valid = (response_mask.detach().amax(dim=-1) != 0).cpu().numpy()
    scores = response_rewards(token_level_rewards)
    bad = valid & ~np.isfinite(scores)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise ApoInputError(
            f"token_level_rewards: {rows.size} of {batch_size} responses have NaN/inf rewards, "
            f"first rows {rows[:5].tolist()}"
        )
    scores = np.where(valid, scores, 0.0)
    success = np.zeros(batch_size)
    success[valid] = success_of(scores[valid], settings)
    codes, n_groups = group_ids(index, batch_size)
    if scopes is None:
        scope_codes, scope_names = np.zeros(batch_size, dtype=np.int64), [GLOBAL_SCOPE]
    else:
        scope_labels = np.asarray(scopes, dtype=object)
        if scope_labels.shape != (batch_size,):
            raise ApoInputError(f"data sources: got {scope_labels.size} for {batch_size} responses")
        raw_codes, uniques = pd.factorize(scope_labels)
        if (raw_codes < 0).any():
            rows = np.flatnonzero(raw_codes < 0)
            raise ApoInputError(
                f"data_source is missing (None/NaN) for {rows.size} of {batch_size} responses, first rows "
                f"{rows[:5].tolist()}; algorithm.apo.anchor_scope=data_source needs a data_source in every row"
            )
        scope_codes, scope_names = raw_codes.astype(np.int64, copy=False), [str(u) for u in uniques]
    group_scope = _group_scopes(scope_codes, codes, n_groups, index) if scopes is not None else None

    weights = valid.astype(np.float64)
    counts = np.bincount(codes, weights=weights, minlength=n_groups)
    centered = np.where(valid, scores - _group_mean(codes, scores * weights, counts)[codes], 0.0)
    _check_no_overflow(centered, settings, out_dtype)
    group_success = _group_mean(codes, success * weights, counts)
    scope_counts = np.bincount(scope_codes, weights=weights, minlength=len(scope_names))
    scope_success = _group_mean(scope_codes, success * weights, scope_counts)

    anchor_of = (lambda name: anchors) if isinstance(anchors, CapabilityAnchor) else anchors.anchor
    values, rates = np.zeros(len(scope_names)), {}
    for k, name in enumerate(scope_names):
        if scope_counts[k] == 0:  # only padding in this scope: nothing observed, the anchor stays as it is
            continue
        values[k], rates[k] = anchor_of(name).update(
            float(scope_success[k]), settings.eta, settings.eta_min, settings.history
        )

    gap = group_success - values[group_scope if group_scope is not None else 0]
    if settings.reweight:
        direction = -np.sign(centered) * np.sign(gap)[codes]
        weight = settings.lambda_scale * np.exp(direction * np.abs(gap)[codes])
    else:
        weight = np.ones_like(centered)
    scalar = torch.from_numpy(weight * centered).to(device=token_level_rewards.device, dtype=out_dtype)
    # One output allocation, and no mixed-dtype product (torch's int64 x float32 broadcast runs ~1.7x slower):
    # copy=True keeps the caller's mask intact when it already has the output dtype.
    advantages = response_mask.to(out_dtype, copy=True).mul_(scalar.unsqueeze(-1))

    metrics: dict[str, float] = {}
    observed = counts > 0
    if observed.any():
        signal_per_group = np.bincount(codes, weights=centered != 0, minlength=n_groups)
        metrics.update({
            "apo/batch_success": float(success[valid].mean()),
            "apo/harder_group_share": float((gap[observed] < 0).mean()),
            "apo/uniform_group_share": float((signal_per_group[observed] == 0).mean()),
        })
    for k, name in enumerate(scope_names):
        if k not in rates:
            continue
        if scopes is None:
            metrics.update({"apo/anchor": float(values[k]), "apo/anchor_rate": rates[k]})
        else:
            metrics.update({
                f"apo/anchor/{name}": float(values[k]),
                f"apo/anchor_rate/{name}": rates[k],
                f"apo/batch_success/{name}": float(scope_success[k]),
            })
    positive, negative = centered > 0, centered < 0
    if positive.any():
        metrics["apo/weight_pos_mean"] = float(weight[positive].mean())
    if negative.any():
        metrics["apo/weight_neg_mean"] = float(weight[negative].mean())
    if isinstance(anchors, AnchorBook):
        anchors.last_metrics = metrics
        anchors.last_phi = weight
        anchors.last_anchor = values[group_scope[codes] if group_scope is not None else np.zeros_like(codes)]
    return advantages, metrics


def apo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=apo``; returns (advantages, returns).

    ``config`` is verl's ``algorithm`` config node; settings come from its ``apo`` child. The anchors are the
    driver process's (``recipe_apo.methods.anchor.driver_anchors``); the step's metrics are left on their
    ``last_metrics`` for the trainer to log.
    """
    settings = ApoSettings.from_algorithm_config(config)
    if index is None:
        raise ApoInputError("the apo estimator needs the uid of each response (non_tensor_batch['uid'])")
    scopes = None
    if settings.anchor_scope == "data_source":
        scopes = handed_scopes()
        if scopes is None:
            raise ApoInputError(
                "algorithm.apo.anchor_scope=data_source needs each response's data_source, which verl does not "
                "pass to estimators: train with `python -m recipe_apo.main` (trainer.v1.trainer_mode=apo_sync)"
            )
    book = driver_anchors(init=settings.anchor_init, history=settings.history)
    advantages, _metrics = compute_apo_advantage(token_level_rewards, response_mask, index, settings, book, scopes)
    return advantages, advantages
