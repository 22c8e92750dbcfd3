"""AGPO's policy loss, ``policy_loss.loss_mode=agpo`` (the authors' ``compute_policy_loss``, verl pull request
#2649 at 4cbea10): verl's clipped PPO surrogate (its dual clip kept) over the tokens of responses whose advantage
is not 0, and the aggregated loss clipped below at 0.

Per token: verl's vanilla loss, max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A), and for A < 0 at most -c A
(``clip_ratio_c``), with the loss mask ``response_mask * (A != 0)``; then ``max(loss, 0)`` of the micro-batch's
aggregated loss, so a micro-batch whose surrogate is already negative gives no gradient.

verl's own ``compute_policy_loss_vanilla`` computes the surrogate (its ``actor/pg_clipfrac``, ``actor/ppo_kl`` and
``actor/pg_clipfrac_lower`` then count the live tokens only, as the authors' did). Where this departs from the
authors' code, and why: verl 0.9.1 normalizes every aggregation by the mini-batch's global counts
(``global_batch_info``: all its response tokens N, or all its responses), which the loss of one micro-batch cannot
change, and sums the micro-batch losses (gradient accumulation): micro-batch m weighs 1 / N. So the masked tokens
leave the numerator (where -A r is 0 anyway) but not the denominator. The authors' verl divided each micro-batch by
its own live tokens n_m and averaged the M micro-batch losses: m weighs 1 / (M n_m). The two agree only on one
micro-batch per mini-batch without A = 0 responses (an all-wrong group at ``wrong_reward=-1`` with the group filter
off has A = 0); with several they differ in direction and scale (docs/agpo.md gives the gap measured by
``scripts/agpo_aggregation.py``; tests/methods/test_agpo.py checks this loss under verl's aggregation). The clip at 0
acts on the same micro-batches in both: a micro-batch's share of the mini-batch's loss has the sign of its own mean.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from recipe_apo.methods.agpo import LOSS, METHOD
from recipe_apo.methods.base import Metric
from recipe_apo.methods.errors import MethodConfigError

# What the loss logs that the reports show.
CLIP_METRICS = {"actor/agpo_loss_clipped": Metric("share of the update's micro-batches whose surrogate was below 0, "
                                                  "clipped to 0 (no gradient)", headline=True)}


@METHOD.loss(LOSS, metrics=CLIP_METRICS)
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
