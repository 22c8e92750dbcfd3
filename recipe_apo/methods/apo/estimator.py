"""The APO advantage estimator (APO paper, sections 4.3-4.5 and the algorithm summary of 4.8).

Paper symbols and their names here, for response i of prompt group g (the estimator's, then the loss's):

- R_i: ``scores``, the sum of the response's token-level rewards.
- A_i = R_i - mean_g(R): ``centered``, the group-centered reward with no std normalization (section 4.3).
- s_i = s(R_i) in [0, 1]: ``success`` (``recipe_apo.methods.apo.success``).
- p_hat_g = mean_g(s): ``p_hat``.
- y_t = mean of s over the batch (or over one data source's responses): ``y``.
- C_t: the capability anchor, ``anchor``; eta_t = clip(eta std(H), eta_min, 1) its rate, ``rates``
  (``recipe_apo.methods.apo.anchor``). C_{t+1} = (1 - eta_t) C_t + eta_t y_t.
- Delta_g = p_hat_g - C_t: ``gap``; the group is harder than the model when Delta_g < 0.
- D_i = -sign(A_i) sign(Delta_g) and Phi_i = lambda_scale exp(D_i |Delta_g|): ``phi``.
- A_i^eff = Phi_i A_i: the returned advantage, on every valid token, 0 on padding.
- tau_+ / tau_- and L0 belong to the loss (``recipe_apo.methods.apo.loss``): the soft gate's temperatures,
  verl's ``tau_pos`` / ``tau_neg``, and the constant token budget, verl's ``loss_scale_factor``.

Order within a step follows the paper's algorithm summary: the anchor is first updated with this batch's y_t,
then Delta_g is measured against the updated anchor C_{t+1}. ``anchor_order=prior`` measures against C_t, the
anchor before the update (HA-DW's order), the first batch's y_1 for an anchor without a start value.

Rows without a single valid token are padding (verl pads a batch to a divisible size with such rows, all under
one made-up uid): they take no part in group means, p_hat_g or y_t, and get advantage 0.

Per-response and per-group maths run in float64 numpy on vectors of batch size, where torch's per-op overhead
would dominate. The (batch, length) work is the rewards' row sums and one copy of the mask into the output,
scaled in place; padding rows are found from the mask's first column, and the full rows of only those that
start masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.methods import driver_state
from recipe_apo.methods.apo import ESTIMATOR, METHOD
from recipe_apo.methods.apo.anchor import GLOBAL_SCOPE, AnchorBook, CapabilityAnchor, driver_anchors
from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.apo.success import success_of
from recipe_apo.methods.checks import check_finite, check_mask, check_no_overflow, check_shapes, output_dtype
from recipe_apo.methods.errors import BatchInputError
from recipe_apo.methods.groups import group_ids, group_mean, response_rewards
from recipe_apo.methods.tensors import from_float64, to_numpy

__all__ = ["apo_outcome_advantage", "compute_apo_advantage"]


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
    the batch has passed: a bad batch raises ``BatchInputError`` and leaves them as they were.
    """
    b = _check_batch(token_level_rewards, response_mask, index, settings, anchors, scopes)
    if b is None:  # no response, or no token in any: nothing observed, the anchors stay as they are
        shape, device = token_level_rewards.shape, token_level_rewards.device
        return torch.zeros(shape, dtype=output_dtype(token_level_rewards), device=device), {}
    # Padding rows count for nothing: they are not counted, and their scores and successes are 0.
    counts = np.bincount(b.codes, weights=b.valid, minlength=b.n_groups)
    centered = np.where(b.valid, b.scores - group_mean(b.codes, b.scores, counts)[b.codes], 0.0)  # A_i
    _check_no_overflow(centered, settings, b.dtype)
    p_hat = group_mean(b.codes, b.success, counts)
    scope_counts = np.bincount(b.scope_codes, weights=b.valid, minlength=len(b.scope_names))
    scope_successes = np.bincount(b.scope_codes, weights=b.success, minlength=len(b.scope_names))
    prior = _priors(anchors, b.scope_names)  # C_t, before this step's update (NaN: not started)
    anchor, rates, y = _update_anchors(anchors, b.scope_names, scope_successes, scope_counts, settings)  # C_{t+1}
    measured = anchor  # the paper's order: C_{t+1}
    if settings.anchor_order == "prior":
        # HA-DW's order: C_t; a scope without one (a warm start) is measured against its first success rate.
        measured = np.where(np.isnan(prior), anchor, prior)
    gap = p_hat - measured[b.group_scope]  # Delta_g
    if settings.reweight:
        phi = settings.lambda_scale * np.exp(-np.sign(centered) * np.sign(gap)[b.codes] * np.abs(gap)[b.codes])
    else:
        phi = np.ones_like(centered)
    advantages = _mask_times(response_mask, phi * centered, b.dtype)  # A_i^eff on every valid token

    metrics = _step_metrics(b, counts, centered, gap, phi, y, anchor, rates, scoped=scopes is not None)
    # Phi_i and the C_t each response was measured against, for the trainer's dump.
    driver_state.record_result("apo", metrics, phi=phi, anchor=measured[b.group_scope[b.codes]])
    return advantages, metrics


@dataclass(frozen=True)
class _Batch:
    """A batch that passed every check: what the maths needs of it, per response unless said otherwise."""

    dtype: torch.dtype  # the advantages'
    valid: np.ndarray  # the row has a valid token (is not padding)
    scores: np.ndarray  # R_i, 0 on padding
    success: np.ndarray  # s_i, 0 on padding
    codes: np.ndarray  # group id
    n_groups: int
    scope_codes: np.ndarray  # scope id (all 0 without scopes)
    scope_names: tuple[str, ...]
    group_scope: np.ndarray  # per group: its scope id


def _check_batch(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    settings: ApoSettings,
    anchors: AnchorBook | CapabilityAnchor,
    scopes: Optional[Any],
) -> Optional[_Batch]:
    """Every check on the batch, in one place and before any anchor moves; raises ``BatchInputError``.

    None for an empty batch (no response, or no token in any), once its uids have passed their check.
    """
    check_shapes(token_level_rewards=token_level_rewards, response_mask=response_mask)
    check_mask(response_mask, prefix="apo: ")
    if scopes is not None and isinstance(anchors, CapabilityAnchor):
        raise BatchInputError("per-scope anchors need an AnchorBook, not a single CapabilityAnchor")
    batch_size = token_level_rewards.shape[0]
    if batch_size == 0 or token_level_rewards.shape[1] == 0:
        group_ids(index, batch_size)
        return None
    valid = _valid_rows(response_mask)
    scores = response_rewards(token_level_rewards)
    check_finite(scores, valid, "rewards")
    scores = np.where(valid, scores, 0.0)  # a padding row's reward may be anything, NaN included
    success = np.zeros(batch_size)
    success[valid] = success_of(scores[valid], settings)
    codes, n_groups = group_ids(index, batch_size)
    if scopes is None:
        scope_codes, scope_names = np.zeros(batch_size, dtype=np.int64), (GLOBAL_SCOPE,)
        group_scope = np.zeros(n_groups, dtype=np.int64)
    else:
        scope_codes, scope_names = _scope_ids(scopes, batch_size)
        group_scope = _group_scopes(scope_codes, codes, n_groups, index)
    return _Batch(output_dtype(token_level_rewards), valid, scores, success, codes, n_groups, scope_codes,
                  scope_names, group_scope)


def _valid_rows(response_mask: torch.Tensor) -> np.ndarray:
    """Per row, whether it has a valid token: ``amax(mask row) != 0`` (a row without one is padding).

    A row whose first entry is positive has a positive maximum, and verl's responses are right-padded (a
    response's first token is valid): only the rows that start masked, verl's padding rows, are read in full.
    """
    mask = response_mask.detach()
    valid = to_numpy(mask[:, 0]) > 0
    rest = np.flatnonzero(~valid)
    if rest.size:
        rows = torch.from_numpy(rest).to(mask.device)
        # Gathering most of the rows would copy most of the mask: then the maxima of all rows read less.
        row_max = mask.amax(dim=-1)[rows] if 2 * rest.size > mask.shape[0] else mask[rows].amax(dim=-1)
        valid[rest] = to_numpy(row_max) != 0
    return valid


def _mask_times(response_mask: torch.Tensor, values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``response_mask * values[:, None]`` in ``dtype`` (``values`` float64, one per row): the step's one
    (batch, length) allocation, a new tensor, so the caller's mask stays intact.

    The mask is copied in the output dtype and then scaled in place: torch's mixed-dtype product (verl's int64
    mask times float rows) takes a slower path than a conversion and a one-dtype product.
    """
    out = torch.empty_like(response_mask, dtype=dtype).copy_(response_mask)
    return out.mul_(from_float64(values, dtype, out.device).unsqueeze(-1))


def _scope_ids(scopes: Any, batch_size: int) -> tuple[np.ndarray, tuple[str, ...]]:
    """Contiguous scope ids per response, and the scopes' names in first-seen order."""
    import pandas as pd  # on use: importing a method's declaration stays light (``recipe_apo.methods.catalog``)

    labels = np.asarray(scopes, dtype=object)
    if labels.shape != (batch_size,):
        raise BatchInputError(f"data sources: got {labels.size} for {batch_size} responses")
    codes, uniques = pd.factorize(labels)
    if (codes < 0).any():
        rows = np.flatnonzero(codes < 0)
        raise BatchInputError(
            f"data_source is missing (None/NaN) for {rows.size} of {batch_size} responses, first rows "
            f"{rows[:5].tolist()}; algorithm.apo.anchor_scope=data_source needs a data_source in every row"
        )
    return codes.astype(np.int64, copy=False), tuple(str(u) for u in uniques)


def _group_scopes(scope_codes: np.ndarray, codes: np.ndarray, n_groups: int, index: Any) -> np.ndarray:
    """The scope of each group; a group whose responses come from different scopes is refused."""
    group_scope = np.zeros(n_groups, dtype=np.int64)
    group_scope[codes] = scope_codes
    mixed = np.flatnonzero(group_scope[codes] != scope_codes)
    if mixed.size:
        raise BatchInputError(
            f"{np.unique(codes[mixed]).size} prompt groups mix data sources (e.g. uid "
            f"{np.asarray(index)[mixed[0]]!r}); algorithm.apo.anchor_scope=data_source needs one data_source per uid"
        )
    return group_scope


def _check_no_overflow(centered: np.ndarray, settings: ApoSettings, dtype: torch.dtype) -> None:
    """Refuse, before any anchor moves, a batch whose advantages could leave ``dtype``'s range.

    |Delta_g| <= 1 (success rates and anchors lie in [0, 1]), so |A_i^eff| <= lambda_scale * e * |A_i|; with the
    mask in [0, 1] (``check_mask``) every token's advantage is then finite. NaN (float64 sums of rewards near its
    max) counts as the largest, so the first bad response is named.
    """
    if not centered.size:
        return
    magnitude = np.where(np.isnan(centered), np.inf, np.abs(centered))
    row = int(np.argmax(magnitude))
    largest = float(magnitude[row])
    bound = largest * (settings.lambda_scale * math.e if settings.reweight else 1.0)
    factor = f" x algorithm.apo.lambda_scale={settings.lambda_scale:g} x e bounds" if settings.reweight else " is"
    way_out = "lower lambda_scale or rescale the rewards" if settings.reweight else "rescale the rewards"
    check_no_overflow(bound, dtype, "apo: ", f"response {row}'s group-centered reward {centered[row]:.3g}{factor} its "
                      f"advantage; {way_out}")


def _priors(anchors: AnchorBook | CapabilityAnchor, scope_names: tuple[str, ...]) -> np.ndarray:
    """Each scope's anchor before this step's update, NaN where it has none yet."""
    if isinstance(anchors, CapabilityAnchor):
        values = [anchors.value] * len(scope_names)
    else:
        values = [anchors.prior(name) for name in scope_names]
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


def _update_anchors(
    anchors: AnchorBook | CapabilityAnchor,
    scope_names: tuple[str, ...],
    successes: np.ndarray,
    scope_counts: np.ndarray,
    settings: ApoSettings,
) -> tuple[np.ndarray, dict[int, float], np.ndarray]:
    """C_{t+1} per scope (0 for a scope of padding only, whose anchor stays as it is: nothing was observed),
    eta_t by scope id for the scopes that moved, and the y_t each moved with (``AnchorBook.observe``: pooled
    over the calls of an open training step)."""
    values, rates, y = np.zeros(len(scope_names)), {}, np.zeros(len(scope_names))
    for k, name in enumerate(scope_names):
        if scope_counts[k] == 0:
            continue
        if isinstance(anchors, CapabilityAnchor):
            y[k] = successes[k] / scope_counts[k]
            values[k], rates[k] = anchors.update(float(y[k]), settings.eta, settings.eta_min, settings.history)
        else:
            values[k], rates[k], y[k] = anchors.observe(name, float(successes[k]), float(scope_counts[k]),
                                                        settings.eta, settings.eta_min, settings.history)
    return values, rates, y


def _step_metrics(
    b: _Batch,
    counts: np.ndarray,
    centered: np.ndarray,
    gap: np.ndarray,
    phi: np.ndarray,
    y: np.ndarray,
    anchor: np.ndarray,
    rates: dict[int, float],
    scoped: bool,
) -> dict[str, float]:
    """The step's ``apo/*`` metrics; none for a batch of padding only."""
    metrics: dict[str, float] = {}
    observed = counts > 0
    if observed.any():
        signal_per_group = np.bincount(b.codes, weights=centered != 0, minlength=b.n_groups)
        metrics.update({
            # The y_t the anchor moved with: this batch's, or the step's so far when verl cuts it in mini-batches.
            "apo/batch_success": float(y[0]) if not scoped else float(b.success[b.valid].mean()),
            "apo/harder_group_share": float((gap[observed] < 0).mean()),
            "apo/uniform_group_share": float((signal_per_group[observed] == 0).mean()),
        })
    for k, name in enumerate(b.scope_names):
        if k not in rates:
            continue
        if not scoped:
            metrics.update({"apo/anchor": float(anchor[k]), "apo/anchor_rate": rates[k]})
        else:
            metrics.update({
                f"apo/anchor/{name}": float(anchor[k]),
                f"apo/anchor_rate/{name}": rates[k],
                f"apo/batch_success/{name}": float(y[k]),
            })
    positive, negative = centered > 0, centered < 0
    if positive.any():
        metrics["apo/weight_pos_mean"] = float(phi[positive].mean())
    if negative.any():
        metrics["apo/weight_neg_mean"] = float(phi[negative].mean())
    return metrics


@METHOD.estimator(ESTIMATOR)
def apo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=apo``; returns (advantages, returns).

    ``config`` is verl's ``algorithm`` config node; settings come from its ``apo`` child. The anchors, the
    handed data sources and the step's results are the driver's (``recipe_apo.methods.driver_state``).
    """
    settings = ApoSettings.from_algorithm_config(config)
    if index is None:
        raise BatchInputError("the apo estimator needs the uid of each response (non_tensor_batch['uid'])")
    scopes = None
    if settings.anchor_scope == "data_source":
        scopes = driver_state.handed_scopes()
        if scopes is None:
            raise BatchInputError(
                "algorithm.apo.anchor_scope=data_source needs each response's data_source, which verl does not "
                "pass to estimators: train with `python -m recipe_apo.main` (trainer.v1.trainer_mode=apo_sync)"
            )
    book = driver_anchors(init=settings.anchor_init, history=settings.history)
    advantages, _metrics = compute_apo_advantage(token_level_rewards, response_mask, index, settings, book, scopes)
    return advantages, advantages
