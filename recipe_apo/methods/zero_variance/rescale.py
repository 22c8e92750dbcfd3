"""The zero-variance denominator, the loss-mask piece of AGPO (arXiv 2503.15952; TRL issue #6367 / PR #6365), as one
setting for any group estimator: ``algorithm.zero_variance=exclude``.

A prompt group whose responses all got the same reward carries no signal (every centered advantage is 0), yet
its responses count in the loss's denominator and dilute the update of the groups that do. ``exclude`` takes
them out of the denominator.

verl 0.9.1 fixes the denominators per mini-batch inside the actor: ``global_batch_size`` (responses of the
mini-batch, for the ``seq-mean-*`` modes) and ``batch_num_tokens`` (its valid tokens, for ``token-mean``). The
driver cannot change them, and does not know which responses land in which mini-batch (the actor cuts and
shuffles them). So ``exclude`` scales the live responses' advantages by the step's

    scale = B / B_live      (seq-mean-token-sum-norm, seq-mean-token-mean, seq-mean-token-sum)
    scale = T / T_live      (token-mean: T counts valid tokens)

where B counts the step's rows as verl's ``global_batch_size`` does (every row handed to the actor, verl's
padding rows of no valid token included: ``trainer_base._update_actor`` fixes it at ``ppo_mini_batch_size * n``
rows and ``_balance_batch`` pads the step to whole mini-batches), and B_live what is left of B once the dead
groups' responses are out; T counts valid tokens (padding rows have none) and T_live those of groups with a
signal. Without padding rows B_live is the live responses. verl's ``vanilla`` loss
(dual clip included) and the ``apo`` gate are positively homogeneous in the advantage (the clip and the gate
act on the ratio; the branch depends on the sign of A only), so this is the loss with the dead responses out of
the denominator: exactly so when a step is one mini-batch, and when every mini-batch has the step's live share;
otherwise mini-batch j's loss is off by the factor (live share of mini-batch j) / (live share of the step)
(``denominator_ratio``; the testbed measures it).
``token-sum`` has no denominator, so it has nothing to exclude; and with ``algorithm.use_kl_in_reward=true`` the
estimator centres KL-penalised rewards, not the scores "dead" is decided on (both refused by ``check_mode``).

Symbols: B, B_live, T, T_live above; "live" groups have at least two distinct rewards among their valid
responses. Needs torch, numpy and pandas only (group ids from ``recipe_apo.methods.groups``).

Multi-output trajectories (an agent loop that returns several outputs, each a row of the batch): a group's
responses are its trajectories, each scored once, on its final output (``outcome_rows``); so a group is dead
when its trajectories' outcomes are all equal, decided on the final rows alone. verl's loss still sums over
rows: every output row is a term of ``global_batch_size`` (rows) or has its tokens in ``batch_num_tokens``
(``core_algos.agg_loss``), so every output of a dead group's trajectories leaves the denominator and B, B_live,
T, T_live count output rows and their tokens.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.methods.checks import AGG_MODES, check_choice, check_finite, check_no_overflow, check_shapes
from recipe_apo.methods.errors import BatchInputError, MethodConfigError
from recipe_apo.methods.group_stats import live_rows

# The recipe's modes; the testbed adds "exact", each mini-batch's own denominators (``runtime``).
MODES = ("keep", "exclude")
SEQUENCE_MODES = ("seq-mean-token-sum-norm", "seq-mean-token-mean", "seq-mean-token-sum")
TOKEN_MODES = ("token-mean",)


def check_mode(mode: Any, loss_agg_mode: Any, use_kl_in_reward: bool = False) -> str:
    """The validated ``algorithm.zero_variance`` value; a ``MethodConfigError`` names the setting at fault.

    ``exclude`` decides which groups are dead on the rewards verl scored (``rm_scores``). With
    ``algorithm.use_kl_in_reward=true`` the estimator centres other rewards, score - beta KL (verl's
    ``apply_kl_penalty``), so a group of equal scores still carries advantages: refused, not guessed at.
    """
    check_choice("algorithm.zero_variance", mode, MODES, MethodConfigError)
    if mode != "exclude":
        return mode
    if loss_agg_mode not in AGG_MODES:
        raise MethodConfigError(
            f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode} is not one of verl's modes: {', '.join(AGG_MODES)}"
        )
    if loss_agg_mode not in SEQUENCE_MODES + TOKEN_MODES:
        raise MethodConfigError(
            f"algorithm.zero_variance=exclude with actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode}: that "
            f"mode has no denominator to exclude from; use one of {', '.join(SEQUENCE_MODES + TOKEN_MODES)}"
        )
    if use_kl_in_reward:
        raise MethodConfigError(
            "algorithm.zero_variance=exclude with algorithm.use_kl_in_reward=true: the estimator centres the "
            "KL-penalised rewards (score - beta KL), so a group of equal scores still has advantages and no group "
            "is ever dead on those rewards; put the KL in the loss (actor_rollout_ref.actor.use_kl_loss=true) or "
            "set algorithm.zero_variance=keep"
        )
    return mode


def zero_variance_scale(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, loss_agg_mode: str,
    outcome_rows: Optional[np.ndarray] = None,
) -> tuple[float, np.ndarray, dict[str, float]]:
    """(scale, live per response, metrics) of one step; scale is 1 when no group is live (nothing to learn).

    ``outcome_rows``: for multi-output trajectories, which rows hold their trajectory's outcome (module docstring).
    """
    check_mode("exclude", loss_agg_mode)
    check_shapes(token_level_rewards=token_level_rewards, response_mask=response_mask)
    tokens = response_mask.detach().to(torch.float64).sum(dim=-1).cpu().numpy()
    valid = tokens > 0
    scores = token_level_rewards.detach().to(torch.float64).sum(dim=-1).cpu().numpy()
    check_finite(scores, valid, "rewards (algorithm.zero_variance=exclude cannot group them)")
    if outcome_rows is not None and np.shape(outcome_rows) != valid.shape:
        raise BatchInputError(f"outcome_rows: {np.size(outcome_rows)} flags for {valid.size} responses")
    live = live_rows(scores, valid, index, outcome_rows)
    if loss_agg_mode in TOKEN_MODES:
        total, kept = float(tokens.sum()), float(tokens[live].sum())
        share = kept / total if total > 0 else 0.0
    else:  # every row is a term of verl's global_batch_size, padding rows too; the dead responses leave it
        total = float(valid.size)
        kept = total - float(np.count_nonzero(valid & ~live))
        valid_count = np.count_nonzero(valid)
        share = float(np.count_nonzero(live)) / valid_count if valid_count else 0.0
    scale = total / kept if live.any() else 1.0
    metrics = {
        "zero_variance/live_share": share,
        "zero_variance/scale": scale,
    }
    return scale, live, metrics


def exclude_zero_variance(
    advantages: torch.Tensor,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    loss_agg_mode: str,
    outcome_rows: Optional[np.ndarray] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's advantages with the dead groups out of the loss's denominator (module docstring).

    Dead responses keep their advantage (0 for centered estimators); live ones are multiplied by the scale.
    ``outcome_rows``: for multi-output trajectories, which rows hold their trajectory's outcome.
    """
    if advantages.shape != response_mask.shape:
        raise BatchInputError(
            f"advantages {tuple(advantages.shape)} and response_mask {tuple(response_mask.shape)} differ in shape"
        )
    scale, live, metrics = zero_variance_scale(token_level_rewards, response_mask, index, loss_agg_mode, outcome_rows)
    _check_no_overflow(advantages, scale)
    factor = torch.from_numpy(np.where(live, scale, 1.0)).to(device=advantages.device, dtype=advantages.dtype)
    return advantages * factor.unsqueeze(-1), metrics


def _check_no_overflow(advantages: torch.Tensor, scale: float) -> None:
    """Refuse a step whose scaled advantages would leave their dtype's range: the scale reaches B (or T) when
    one response is live, and the estimators only bound the advantages they return."""
    if not advantages.is_floating_point() or advantages.numel() == 0 or scale <= 1.0:
        return
    low, high = torch.aminmax(advantages.detach())  # no (n, T) temporary, unlike abs().amax()
    largest = max(-float(low), float(high))
    check_no_overflow(largest * scale, advantages.dtype, "algorithm.zero_variance=exclude: the scaled ",
                      f"the largest advantage {largest:.3g} x the step's scale {scale:.3g}; rescale the rewards")


def denominator_ratio(live: np.ndarray, rows: np.ndarray, tokens: np.ndarray, loss_agg_mode: str) -> float:
    """How far ``exclude``'s step-level scale is off for one mini-batch (``rows``): its loss with the scale over
    its loss with its own dead responses out of its denominator (1: exact)."""
    weight = tokens if loss_agg_mode in TOKEN_MODES else (tokens > 0).astype(np.float64)
    step_share = weight[live].sum() / weight.sum()
    mini_share = weight[rows][live[rows]].sum() / weight[rows].sum()
    if step_share == 0 or mini_share == 0:
        return 1.0  # no live response: a zero loss either way
    return float(mini_share / step_share)
