"""R2PO's two advantages (RRPO-ARR/Code at 8a2cc4d, ``simple_grpo_v1/``), one per phase of its schedule.

Symbols, for response i of prompt group g (verl's uid), R_i its reward (the sum of its token-level rewards):

- **rarity** (head phase; ``rollout_head_train.py::reward_rarity``, registered as ``rarity``):
  s_i = 1 / #{j in g : R_j = R_i} (exact equality, as the source's ``unique`` counts), and
  A_i = (s_i - mean_g s) / (std_g s + 1e-6), std the sample std (n - 1, ``torch.std``). A group whose s are all
  equal (all rewards equal, or each reward as frequent as every other) gets A = 0: the source skips it. A rare
  outcome is rewarded whatever its sign: the head learns to reach the outcomes the group seldom reaches.
- **GRPO with the range skip** (policy phase; ``adaptor_grpo_split.py``): A_i = (R_i - mean_g R) / (std_g R + 1e-4)
  (sample std), and A = 0 for a group whose rewards span less than 0.01 (max - min < 0.01).

``r2po`` is the estimator a run names (``algorithm.adv_estimator=r2po``): each step it computes the advantage of
the step's phase, which the runtime hands over (``driver_state``).

Where this departs from the source, and why:

- the source's batch is one group (one prompt, G = 8); here a batch holds many groups, each computed alone;
- a group whose s are all equal is found on the counts (exactly), and given what the source's float32 arithmetic
  gives it (``equal_rarity``): 0 (skipped), or where float32's mean of the equal s is not s itself (a group of 9 in
  three thirds) the small constant the source trains on;
- statistics in float64, rounded once to the rewards' dtype (the source: float32 throughout, so the two differ in
  the last bits); rows without a valid token (verl's padding) take no part and get A = 0;
- the range skip compares in the rewards' own precision: a group spans less than 0.01 where max - min is below
  0.01 by more than the rewards' resolution (``resolution``: one unit in the last place of the group's largest
  |R| in the rewards' dtype), or is 0. The source compares its float32 spread with float64's 0.01, which skips
  rewards 0.01 apart that float32 cannot tell from it: 0 and 0.01 (0.00999999978 in float32), 0.3 and 0.31
  (0.00999999046), 597 of the 1000 pairs k/100, k/100 + 0.01 for k < 1000;
- a skipped group still reaches verl's loss with A = 0, where the source drops it from the batch: its tokens count
  in the loss's token mean and, with the KL loss on, its KL term still acts (the source's skip drops it too).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.methods import driver_state
from recipe_apo.methods.checks import check_advantages, check_finite, check_shapes, output_dtype
from recipe_apo.methods.errors import BatchInputError, MethodStateError
from recipe_apo.methods.groups import centered_rewards, group_ids, group_range, response_rewards
from recipe_apo.methods.r2po import METHOD
from recipe_apo.methods.tensors import from_float64

RARITY_EPSILON = 1e-6  # the source's reward_rarity
GRPO_EPSILON = 1e-4    # the source's policy phase
RANGE_SKIP = 0.01      # a policy-phase group whose rewards span less is skipped

# The names verl knows them by, and the name of the phase the runtime hands the ``r2po`` estimator.
RARITY = "rarity"
ESTIMATOR = "r2po"


def reward_counts(scores: np.ndarray, codes: np.ndarray, n_groups: int, valid: np.ndarray) -> tuple[np.ndarray,
                                                                                                     np.ndarray]:
    """(count, equal): per row the number of valid responses of its group with its reward (0 for an invalid row;
    s_i = 1 / count_i), and per group whether all its counts are equal (a group with no valid response counts as
    equal). Vectorized: one sort by (group, reward)."""
    n = scores.shape[0]
    rows = np.flatnonzero(valid)
    order = rows[np.lexsort((scores[rows], codes[rows]))]
    key_group, key_score = codes[order], scores[order]
    starts = np.ones(order.size, dtype=bool)
    starts[1:] = (key_group[1:] != key_group[:-1]) | (key_score[1:] != key_score[:-1])
    run = np.cumsum(starts) - 1
    run_sizes = np.bincount(run)
    count = np.zeros(n, dtype=np.int64)
    count[order] = run_sizes[run]
    low, high = group_range(codes[rows], n_groups, count[rows])
    return count, ~(low < high)


@functools.lru_cache(maxsize=None)
def equal_rarity(size: int, count: int) -> float:
    """The source's rarity of every response of a group of ``size`` whose s are all 1 / ``count``: 0 where float32's
    mean of the equal s is s itself (the source skips the group), else the constant its float32 arithmetic gives
    (a group of 9 in three thirds of 3: s - mean s is one last bit, divided by its std + 1e-6: 0.0289). Computed as
    the source computes it, once per (size, count)."""
    s = torch.full((size,), 1.0 / count, dtype=torch.float32)
    centered = s - s.mean()
    if bool((centered == 0).all()):
        return 0.0
    return float((centered / (s.std() + RARITY_EPSILON))[0])


def rarity_advantage(scores: np.ndarray, codes: np.ndarray, n_groups: int, valid: np.ndarray) -> tuple[np.ndarray,
                                                                                                       np.ndarray]:
    """(A, skipped groups): the rarity advantage of the module's docstring, float64; a group whose s are all equal
    gets ``equal_rarity`` (0 but for float32's last bit), and is skipped where that is 0."""
    count, equal = reward_counts(scores, codes, n_groups, valid)
    s = np.divide(1.0, count, out=np.zeros(count.size), where=count > 0)
    w = valid.astype(np.float64)
    counts = np.bincount(codes, weights=w, minlength=n_groups)
    advantage = centered_rewards(s, w, codes, counts, True, RARITY_EPSILON)
    constant = np.zeros(n_groups)
    sizes = counts.astype(np.int64)
    group_count = np.zeros(n_groups, dtype=np.int64)
    group_count[codes[valid]] = count[valid]  # one value per group where they are all equal, the only groups read
    for size, each in {(int(a), int(b)) for a, b in zip(sizes[equal], group_count[equal]) if a > 0}:  # a few pairs
        constant[equal & (sizes == size) & (group_count == each)] = equal_rarity(size, each)
    advantage = np.where(equal[codes], constant[codes], advantage)
    skipped = equal & (constant == 0)
    return np.where(valid & ~skipped[codes], advantage, 0.0), skipped


def range_skipped_advantage(scores: np.ndarray, codes: np.ndarray, n_groups: int, valid: np.ndarray,
                            eps: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(A, skipped groups): GRPO's advantage with the source's epsilon and range skip, float64. A group is skipped
    where its spread max - min is 0, or below 0.01 by more than the ``resolution`` of its largest |R| in the
    rewards' type (machine epsilon ``eps``; 0 for integer rewards): the rewards' own precision."""
    w = valid.astype(np.float64)
    counts = np.bincount(codes, weights=w, minlength=n_groups)
    low, high = group_range(codes[valid], n_groups, scores[valid])
    with np.errstate(over="ignore"):  # rewards near float64's max span inf: not skipped, as they span more than 0.01
        spread = high - low  # exact where it matters: the difference of two nearby float32 (or float64) values
    slack = resolution(np.maximum(np.abs(low), np.abs(high)), eps)
    skipped = ~((spread >= RANGE_SKIP - slack) & (spread > 0))  # a group with no valid response: (inf, -inf)
    advantage = centered_rewards(scores, w, codes, counts, True, GRPO_EPSILON)
    return np.where(valid & ~skipped[codes], advantage, 0.0), skipped


RULES = {0: rarity_advantage, 1: range_skipped_advantage}  # by phase (schedule.HEAD, schedule.POLICY)


def check_phase(phase: Any) -> int:
    """``phase`` as an int if it is one of ``RULES`` (0 head, 1 policy), else ``MethodStateError`` naming it: the
    phase comes from R2PO's runtime, never from the batch."""
    if isinstance(phase, (int, np.integer)) and not isinstance(phase, bool) and int(phase) in RULES:
        return int(phase)
    raise MethodStateError(f"r2po: the step's phase must be 0 (head) or 1 (policy), got {phase!r}")


def resolution(values: np.ndarray, eps: float) -> np.ndarray:
    """One unit in the last place of each of ``values`` in a floating type of machine epsilon ``eps`` (the
    spacing of its numbers at that magnitude; 0 for ``eps`` 0, integers); a non-finite value gets 0."""
    finite = np.isfinite(values)
    _, exponent = np.frexp(np.where(finite, np.abs(values), 0.0))
    return np.where(finite, eps * np.ldexp(1.0, exponent - 1), 0.0)


def compute_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
                      phase: int) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """The advantages of ``phase``'s rule, (batch, response_len) in the rewards' dtype (float32 for integer
    rewards), and the per-row arrays behind them: ``valid``, ``skipped`` (the row's group was skipped)."""
    phase = check_phase(phase)
    check_shapes(token_level_rewards=token_level_rewards, response_mask=response_mask)
    if index is None:
        raise BatchInputError("the r2po estimators need the uid of each response (non_tensor_batch['uid'])")
    batch_size = token_level_rewards.shape[0]
    out_dtype = output_dtype(token_level_rewards)
    codes, n_groups = group_ids(index, batch_size)
    mask = torch.empty_like(response_mask, dtype=torch.float32).copy_(response_mask.detach())
    valid = mask.sum(dim=-1).cpu().numpy() > 0
    scores = response_rewards(token_level_rewards)
    check_finite(scores, valid, "rewards", prefix="r2po")
    if phase == 0:
        advantage, skipped = rarity_advantage(scores, codes, n_groups, valid)
    else:
        eps = torch.finfo(token_level_rewards.dtype).eps if token_level_rewards.is_floating_point() else 0.0
        advantage, skipped = range_skipped_advantage(scores, codes, n_groups, valid, eps)
    out = mask if out_dtype == torch.float32 else torch.empty_like(response_mask, dtype=out_dtype).copy_(response_mask)
    advantages = out.mul_(from_float64(advantage, out_dtype, out.device).unsqueeze(-1))
    check_advantages("r2po", advantage, out_dtype, response_mask=response_mask)  # a (NaN) mask or an overflow
    return advantages, {"valid": valid, "skipped": skipped[codes] & valid}


@METHOD.estimator(RARITY)
def rarity_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                             config: Optional[Any] = None, index: Optional[np.ndarray] = None,
                             **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=rarity``: the head phase's rule alone."""
    advantages, _rows = compute_advantage(token_level_rewards, response_mask, index, 0)
    return advantages, advantages


@METHOD.estimator(ESTIMATOR, needs="the step's phase, from R2PO's runtime")
def r2po_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                           config: Optional[Any] = None, index: Optional[np.ndarray] = None,
                           **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature for ``algorithm.adv_estimator=r2po``: the rule of the phase the runtime handed
    (the recipe's trainer or the testbed), and the rows behind it for the runtime's metrics."""
    phase = driver_state.kept(ESTIMATOR, lambda: None)
    if phase is None:
        raise MethodStateError("the r2po estimator reads the step's phase from R2PO's runtime: run it with the "
                               "recipe's trainer (python -m recipe_apo.main method=r2po) or the testbed; "
                               "algorithm.adv_estimator=rarity is the head phase's rule alone")
    advantages, rows = compute_advantage(token_level_rewards, response_mask, index, phase)
    driver_state.record_result(ESTIMATOR, {}, **rows)
    return advantages, advantages
