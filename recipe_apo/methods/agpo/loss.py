"""AGPO's policy loss, ``policy_loss.loss_mode=agpo`` (the authors' ``compute_policy_loss``, verl pull request
#2649 at 4cbea10): verl's clipped PPO surrogate (its dual clip kept) over the tokens of responses whose advantage
is not 0, and the aggregated loss clipped below at 0.

Per token: verl's vanilla loss, max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A), and for A < 0 at most -c A
(``clip_ratio_c``), with the loss mask ``response_mask * (A != 0)``; then ``max(loss, 0)`` of the micro-batch's
aggregated loss, so a micro-batch whose surrogate is already negative gives no gradient.

verl's own ``compute_policy_loss_vanilla`` computes the surrogate (its ``actor/pg_clipfrac``, ``actor/ppo_kl`` and
``actor/pg_clipfrac_lower`` then count the live tokens only, as the authors' did). Where this departs from the
authors' code, and why: verl 0.9.1 normalizes every aggregation by the mini-batch's global counts
(``global_batch_info``: all its tokens, or all its responses), which the loss of one micro-batch cannot change, so
the masked tokens leave the numerator (where -A r is 0 anyway) but not the denominator. The authors' verl
normalized each micro-batch by its own live tokens. With AGPO's estimator no response has A = 0 unless a group's
rewards are all equal at a value other than 0 or 1, so for 0/1 rewards the two agree. The clip at 0 acts on the
same micro-batches in both: a micro-batch's share of the mini-batch's loss has the sign of its own mean.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from recipe_apo.methods.errors import MethodConfigError


def compute_policy_loss_agpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's policy-loss signature for ``policy_loss.loss_mode=agpo``; returns (loss, metrics)."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla  # at call time: see recipe_apo.plugin

    if config is None:
        raise MethodConfigError("loss_mode=agpo needs the actor config (clip_ratio_low, clip_ratio_high, clip_ratio_c)")
    live_mask = response_mask * (advantages != 0).to(response_mask.dtype)
    pg_loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, live_mask, loss_agg_mode,
                                                   config, rollout_is_weights)
    with torch.no_grad():
        clipped = (pg_loss < 0).float().item()
    metrics["actor/agpo_loss_clipped"] = clipped
    return torch.clamp(pg_loss, min=0.0), metrics
