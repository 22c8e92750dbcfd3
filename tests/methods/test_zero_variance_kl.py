"""``algorithm.zero_variance=exclude`` with the KL in the loss (``actor_rollout_ref.actor.use_kl_loss=true``): the
gradient of verl's actor loss (its ``ppo_loss`` adds ``kl_loss_coef * agg_loss(kl_penalty(...))`` to the policy
loss, over the same rows and denominators) worked by hand. ``exclude`` scales the live advantages only, so the dead
groups leave the policy-gradient term's denominator and stay in the KL term's: their tokens keep the KL's pull
toward the reference, and a live token's KL pull is the live share of what it would be with the dead groups gone
(docs/beside_apo.md, "the zero-variance denominator")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

from recipe_apo.methods.zero_variance.rescale import exclude_zero_variance

COEF = 0.1


def _actor_loss_gradient(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """d loss / d log_prob of verl's vanilla policy loss plus the k1 KL term, token-mean, on-policy (ratio 1), the
    reference 0.3 below the policy on every token."""
    log_prob = torch.zeros_like(mask, requires_grad=True)
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                               "tis_imp_ratio_cap": -1, "global_batch_info": {}})
    policy_loss, _ = get_policy_loss_fn("vanilla")(old_log_prob=log_prob.detach(), log_prob=log_prob,
                                                   advantages=advantages, response_mask=mask,
                                                   loss_agg_mode="token-mean", config=config)
    kl = agg_loss(kl_penalty(log_prob, log_prob.detach() - 0.3, "kl"), mask, "token-mean")
    (policy_loss + COEF * kl).backward()
    return log_prob.grad


def test_dead_groups_keep_their_kl_pull_and_live_tokens_get_the_excluded_policy_gradient():
    # Group a: rewards 1, 0 (live, Dr. GRPO advantages +-0.5); group b: 1, 1 (dead). Two tokens a response: T = 8,
    # T_live = 4, scale 2.
    mask = torch.ones(4, 2)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    advantages = torch.tensor([0.5, -0.5, 0.0, 0.0]).unsqueeze(-1) * mask
    scaled, metrics = exclude_zero_variance(advantages, rewards, mask, np.array(["a", "a", "b", "b"], dtype=object),
                                            "token-mean")
    assert metrics["zero_variance/scale"] == pytest.approx(2.0)

    gradient = _actor_loss_gradient(scaled, mask)

    # Per token: -A * scale / T from the policy term, COEF / T from the KL term, T = 8 for both.
    live_up, live_down, dead = -0.5 * 2 / 8 + COEF / 8, 0.5 * 2 / 8 + COEF / 8, COEF / 8
    expected = torch.tensor([[live_up] * 2, [live_down] * 2, [dead] * 2, [dead] * 2])
    assert torch.allclose(gradient, expected, atol=1e-7)
    # The loss with the dead groups gone (both terms over the live tokens, T_live = 4) differs in the KL alone:
    # a live token's KL pull there is COEF / 4, here COEF / 8 (the live share, 1/2, of it), and a dead token's 0.
    without_dead = torch.tensor([[-0.5 / 4 + COEF / 4] * 2, [0.5 / 4 + COEF / 4] * 2, [0.0] * 2, [0.0] * 2])
    assert torch.allclose(gradient - without_dead, torch.tensor([[-COEF / 8] * 2] * 2 + [[COEF / 8] * 2] * 2),
                          atol=1e-7)
