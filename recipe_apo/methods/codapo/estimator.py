"""CoDaPO's confidence-difficulty weighting and its prompt resampling (tmlr-group/CoDaPO at 210c205:
``compute_codapo_advantage`` in ``alphaapollo/core/generation/verl/trainer/ppo/core_algos.py`` and the
two-phase reselection in ``codapo/ray_trainer.py``). The code is followed where its README differs (below).

Symbols, per prompt group g and response i:

- A_i: ``centered``, R_i - mean_g(R), divided by (std_g(R) + epsilon) when ``norm_adv_by_std_in_grpo`` is true
  (sample std, n - 1, as ``torch.std``; epsilon 1e-6), as CoDaPO's code does.
- acc_g: ``accuracy``, the share of the group's rewards exactly equal to 1.0 (CoDaPO compares with ``== 1.0``).
- d_w = 4 acc_g (1 - acc_g): ``difficulty_weight``; CoDaPO writes it 1 - 4 (d - 0.5)^2 with d = 1 - acc_g, the
  same curve: 0 for groups all right or all wrong, 1 at half right. CoDaPO's README and its code comment call
  it "U-shaped"; it is an inverted U, peaking in the middle.
- c_g = exp(mean over the group's responses of each response's mean token log-prob under the old policy):
  ``confidence``.
- w_g = c_g d_w + weight_offset (0.1): ``weight``, in [offset, 1 + offset]. The README's v_q = V_c V_d has no
  offset; the code adds 0.1, so a dead group gets 0.1 (its centered advantage is 0 anyway).
- A_i^eff = A_i w_g on every valid token.

Resampling: each loader batch serves two steps. After the first, the prompts whose w_g reaches the
``percentile`` quantile of the step's per-prompt weights (``torch.quantile``, linear interpolation, kept when
``w_g >= threshold``: ties can keep more than a quarter) are kept; the second step's batch repeats each kept
prompt ``repeat_count`` times in place ([a, a, a, a, b, b, b, b, ...]), starts over from the first when the
batch is not full, and is cut to the batch size. Each copy is a fresh group of its own.

verl does not pass old log-probs to estimators: the recipe's trainer hands them over
(``recipe_apo.methods.driver_state.handed``).
Needs torch, numpy and pandas only; no Ray, no Hydra.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.methods import driver_state
from recipe_apo.methods.checks import (
    check_finite,
    check_mask,
    check_no_overflow,
    check_shapes,
    output_dtype,
)
from recipe_apo.methods.codapo import ESTIMATOR, METHOD
from recipe_apo.methods.codapo.settings import CodapoSettings
from recipe_apo.methods.errors import BatchInputError, MethodConfigError
from recipe_apo.methods.groups import centered_rewards, group_ids, group_mean, response_rewards
from recipe_apo.methods.settings import read_flag
from recipe_apo.methods.tensors import from_float64, to_numpy

EPSILON = 1e-6


# Rows per chunk of the masked log-prob sums and maxima: about 4M elements (16 MiB of float32) per temporary.
_CHUNK_ELEMENTS = 1 << 22


def _masked_row_sums_and_maxima(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_t values * mask and max_t values * mask per row, in chunks of rows whose product stays in cache: one
    (batch, length) product, or a bmm, would write a batch-sized temporary out to memory and read it back. The
    maximum is 0 on a row with padding, so it only tells whether a valid value is above 0."""
    rows = max(1, _CHUNK_ELEMENTS // max(1, values.shape[1]))
    sums = torch.empty(values.shape[0], dtype=values.dtype, device=values.device)
    maxima = torch.zeros_like(sums)
    if values.shape[1] == 0:
        return sums.zero_(), maxima
    for start in range(0, values.shape[0], rows):
        product = values[start:start + rows] * mask[start:start + rows]
        torch.sum(product, dim=-1, out=sums[start:start + rows])
        torch.amax(product, dim=-1, out=maxima[start:start + rows])
    return sums, maxima


# A log-softmax is <= 0; the slack leaves room for a kernel that rounds near 0 (float32 rounds logits of ~30 by
# ~2e-6). A token log-prob above it is a broken rollout or actor, whose c_g = exp(...) overflows (+800 gave inf
# weights and NaN advantages) or silently outweighs every other group.
LOG_PROB_TOLERANCE = 1e-3


def compute_codapo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    index: Any,
    norm_adv_by_std: bool = True,
    weight_offset: float = 0.1,
    epsilon: float = EPSILON,
) -> tuple[torch.Tensor, np.ndarray, dict[str, float]]:
    """CoDaPO advantages A_i^eff (batch, response_len), the per-response weight w_g (float64), and metrics.

    Rows without a valid token are verl's padding: they take no part in any group statistic and get
    advantage 0 (CoDaPO's code has no padding rows). A group of one valid response has mean 0 and std 1, as
    in CoDaPO (A_i = R_i).
    """
    check_shapes(token_level_rewards=token_level_rewards, response_mask=response_mask, old_log_probs=old_log_probs)
    check_mask(response_mask, prefix="codapo: ")
    batch_size = token_level_rewards.shape[0]
    out_dtype = output_dtype(token_level_rewards)
    codes, n_groups = group_ids(index, batch_size)
    # float32 for the token-level work: float64 copies of (batch, length) tensors cost more than the maths.
    # The float32 mask is also the output when the output is float32 (scaled in place at the end).
    mask = torch.empty_like(response_mask, dtype=torch.float32).copy_(response_mask.detach())
    tokens = to_numpy(mask.sum(dim=-1)).astype(np.float64)  # exact: counts far below 2^24
    valid = tokens > 0
    scores = response_rewards(token_level_rewards)
    sums, maxima = _masked_row_sums_and_maxima(old_log_probs.detach().to(torch.float32), mask)
    log_prob_sum = to_numpy(sums).astype(np.float64)
    _check_inputs(valid, scores, log_prob_sum, to_numpy(maxima).astype(np.float64))
    mean_log_prob = np.divide(log_prob_sum, tokens, out=np.zeros(batch_size), where=valid)

    w = valid.astype(np.float64)
    counts = np.bincount(codes, weights=w, minlength=n_groups)

    centered = centered_rewards(scores, w, codes, counts, norm_adv_by_std, epsilon)
    accuracy = group_mean(codes, (scores == 1.0).astype(np.float64) * w, counts)
    difficulty_weight = 4.0 * accuracy * (1.0 - accuracy)
    confidence = np.exp(group_mean(codes, mean_log_prob * w, counts))
    group_weight = confidence * difficulty_weight + weight_offset
    weight = np.where(valid, group_weight[codes], 0.0)
    scalar = np.where(valid, centered * weight, 0.0)
    _check_no_overflow(scalar, centered, weight, weight_offset, out_dtype)
    out = mask if out_dtype == torch.float32 else torch.empty_like(response_mask, dtype=out_dtype).copy_(response_mask)
    advantages = out.mul_(from_float64(scalar, out_dtype, out.device).unsqueeze(-1))
    observed = counts > 0
    metrics: dict[str, float] = {}
    if observed.any():
        metrics = {
            "codapo/weight_mean": float(group_weight[observed].mean()),
            "codapo/confidence_mean": float(confidence[observed].mean()),
            "codapo/difficulty_weight_mean": float(difficulty_weight[observed].mean()),
            "codapo/accuracy_mean": float(accuracy[observed].mean()),
        }
    return advantages, weight, metrics


def _check_inputs(valid: np.ndarray, scores: np.ndarray, log_prob_sum: np.ndarray, log_prob_max: np.ndarray) -> None:
    """Refuse rewards or old log-probs the maths cannot use, naming the field and the first rows."""
    batch_size = valid.size
    check_finite(scores + log_prob_sum, valid, "rewards or old log-probs", prefix="codapo")
    positive = valid & (log_prob_max > LOG_PROB_TOLERANCE)
    if positive.any():
        rows = np.flatnonzero(positive)
        raise BatchInputError(
            f"old_log_probs: {rows.size} of {batch_size} responses have a token log-prob above 0 (largest "
            f"{log_prob_max[rows].max():.3g}; a log-probability is <= 0), first rows {rows[:5].tolist()}: the old "
            "policy's log-probs are broken (rollout or actor)"
        )


def _check_no_overflow(scalar: np.ndarray, centered: np.ndarray, weight: np.ndarray, weight_offset: float,
                       dtype: torch.dtype) -> None:
    """Refuse advantages that would leave ``dtype``'s range (inf, or NaN from inf - inf), naming the response and
    its two factors: the bounded settings keep w_g <= 1 + 1e3, but rewards of any finite size still get here."""
    if not scalar.size:
        return
    magnitude = np.where(np.isnan(scalar), np.inf, np.abs(scalar))
    row = int(np.argmax(magnitude))
    check_no_overflow(float(magnitude[row]), dtype, "codapo: ",
                      f"response {row}'s group-centered reward {centered[row]:.3g} x w_g {weight[row]:.3g} "
                      f"(algorithm.codapo.weight_offset={weight_offset:g}); rescale the rewards or lower weight_offset")


def select_prompts(prompt_uids: Any, response_uids: Any, response_weights: np.ndarray, percentile: float) -> np.ndarray:
    """Positions (in ``prompt_uids`` order) of the prompts kept for the second step of a pair.

    A prompt is kept when its w_g reaches ``torch.quantile(weights of all prompts, percentile)`` (linear
    interpolation). A prompt without any response (none came back) is not kept.
    """
    import pandas as pd  # on use: importing a method's declaration stays light (``recipe_apo.methods.catalog``)

    prompts = np.asarray(prompt_uids, dtype=object)
    responses = np.asarray(response_uids, dtype=object)
    weights = np.asarray(response_weights, dtype=np.float64)
    if responses.shape != weights.shape:
        raise BatchInputError(f"codapo: {responses.size} response uids but {weights.size} weights")
    # One weight per group, its first response's (all responses of a group carry the same w_g).
    by_uid = pd.Series(weights, index=pd.Index(responses))
    prompt_weight = by_uid[~by_uid.index.duplicated()].reindex(pd.Index(prompts)).to_numpy(dtype=np.float64)
    have = ~np.isnan(prompt_weight)
    if not have.any():
        raise BatchInputError("codapo: none of the step's prompts has a weighted response to resample from")
    threshold = float(torch.quantile(torch.tensor(prompt_weight[have]), percentile))
    return np.flatnonzero(have & (prompt_weight >= threshold))


def resample_order(kept: np.ndarray, batch_size: int, repeat_count: int) -> np.ndarray:
    """The second step's prompts, as positions: each kept prompt ``repeat_count`` times in place, starting over
    from the first kept prompt until ``batch_size`` are filled (CoDaPO's loop, which stops when the batch is full).

    Slot j of that list is copy j mod (k r) of one pass [a] * r + [b] * r + ..., i.e. kept prompt
    (j mod (k r)) // r: only the ``batch_size`` slots kept are built, whatever r. A count past the batch size
    fills it with the first kept prompt, as a count equal to it does, so r is capped there (k r then fits int64).
    """
    kept = np.asarray(kept, dtype=np.int64)
    if kept.size == 0:
        raise BatchInputError("codapo: no prompt kept to resample from")
    if isinstance(repeat_count, bool) or not isinstance(repeat_count, (int, np.integer)) or repeat_count < 1:
        raise BatchInputError(f"codapo: repeat_count must be an integer >= 1, got {repeat_count!r}")
    copies = max(1, min(int(repeat_count), int(batch_size)))
    slots = np.arange(batch_size, dtype=np.int64)
    return kept[slots % (kept.size * copies) // copies]


@METHOD.estimator(ESTIMATOR, needs="the old policy's log-probs", reads_std_norm=True)
def codapo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    index: Optional[np.ndarray] = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=codapo``; returns (advantages, returns)."""
    settings = CodapoSettings.from_algorithm_config(config)
    if index is None:
        raise BatchInputError("the codapo estimator needs the uid of each response (non_tensor_batch['uid'])")
    log_probs = driver_state.handed_log_probs()
    if log_probs is None:
        raise BatchInputError(
            "algorithm.adv_estimator=codapo needs the old policy's log-probs, which verl 0.9.1 does not pass to "
            "estimators: train with `python -m recipe_apo.main` (trainer.v1.trainer_mode=apo_sync)"
        )
    norm = read_flag(config, "norm_adv_by_std_in_grpo", True, MethodConfigError)
    advantages, weights, metrics = compute_codapo_advantage(
        token_level_rewards, response_mask, log_probs, index, norm, settings.weight_offset
    )
    # w_g per response with its prompt's uid: the trainer logs, dumps and resamples from them.
    driver_state.record_result("codapo", metrics, uids=np.asarray(index, dtype=object), weights=weights)
    return advantages, advantages
