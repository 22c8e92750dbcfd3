#!/usr/bin/env python
"""How far AGPO's loss under verl 0.9.1's aggregation is from its authors' when a mini-batch is split into
micro-batches (docs/agpo.md, "The loss's denominator"). CPU, about 7 CPU-seconds:

    python scripts/agpo_aggregation.py                      # 400 random mini-batches of 8 prompts x 8, 4 micro-batches
    python scripts/agpo_aggregation.py --micro 1 --trials 50   # one micro-batch: the two agree

Each trial draws a mini-batch of 0/1 rewards (each prompt its own success rate; the group filter's mini-batch: only
groups with right and wrong answers, or every group with ``--no-filter``), response lengths from 1 to
``--max-len`` tokens, the registered ``agpo`` estimator's advantages, and log-probs whose ratios to the old ones
spread about +-10% (0.2 / 0.28 clip, as the preset). The mini-batch is split into ``--micro`` equal micro-batches,
in order (verl's ``actor.shuffle`` is false by default, so a group's responses stay together) or shuffled
(``--shuffle``). The two aggregations, each micro-batch's loss being ``compute_policy_loss_agpo`` (clipped at 0):

- verl 0.9.1 (what the recipe trains with): each micro-batch's live-token sum divided by the mini-batch's count
  of response tokens (``global_batch_info['batch_num_tokens']``, the actor's ``loss_mask``), the micro-batch
  losses summed by gradient accumulation;
- the authors' verl (4cbea10, ``dp_actor``): each micro-batch's mean over its own live tokens, divided by the
  number of micro-batches (``gradient_accumulation``), summed.

Printed: the cosine between the two gradients with respect to the per-token log-probs (the model's gradient is
the network's Jacobian applied to it) and the norm ratio |authors'| / |verl 0.9.1's|, over the trials where both
are non-zero: min, 5%, median, 95%, max.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from recipe_apo.methods.agpo.estimator import compute_agpo_advantage
from recipe_apo.methods.agpo.loss import compute_policy_loss_agpo
from recipe_apo.methods.agpo.settings import AgpoSettings


def actor_config():
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)


def mini_batch(rng: np.random.Generator, prompts: int, n: int, max_len: int, keep_all: bool, wrong_reward: int):
    """(old log-probs, new log-probs, advantages, response mask) of one mini-batch."""
    rows = []
    while len(rows) < prompts:
        rate = rng.uniform(0.05, 0.95)
        rewards = (rng.random(n) < rate).astype(np.float32)
        if keep_all or 0 < rewards.sum() < n:
            rows.append(rewards)
    rewards = np.concatenate(rows)
    lengths = rng.integers(1, max_len + 1, size=rewards.size)
    mask = torch.from_numpy((np.arange(max_len)[None, :] < lengths[:, None]).astype(np.float32))
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(rewards.size), torch.from_numpy(lengths - 1)] = torch.from_numpy(rewards)
    uids = np.repeat(np.arange(prompts), n)
    advantages, _ = compute_agpo_advantage(token_rewards, mask, uids,
                                           settings=AgpoSettings(wrong_reward=wrong_reward))
    old = torch.from_numpy(-rng.exponential(1.0, size=mask.shape).astype(np.float32))
    new = old + torch.from_numpy(rng.normal(0.0, 0.1, size=mask.shape).astype(np.float32))
    return old, new, advantages, mask


def gradient(old, new, advantages, mask, parts, config, global_tokens: bool) -> torch.Tensor:
    """d(loss)/d(new log-probs): the micro-batch losses of ``parts`` (row index arrays) accumulated."""
    new = new.clone().requires_grad_(True)
    losses = []
    for rows in parts:
        if global_tokens:  # verl 0.9.1: ppo_loss hands every micro-batch the mini-batch's counts
            config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()),
                                            global_batch_size=mask.shape[0], loss_scale_factor=None)
        else:  # the authors' verl: agg_loss on the micro-batch alone, then / gradient_accumulation
            config.global_batch_info.clear()
        loss, _ = compute_policy_loss_agpo(old[rows], new[rows], advantages[rows], mask[rows], "token-mean", config)
        losses.append(loss if global_tokens else loss / len(parts))
    (grad,) = torch.autograd.grad(torch.stack(losses).sum(), new)
    return grad


def summary(values: np.ndarray) -> str:
    q = np.quantile(values, [0.0, 0.05, 0.5, 0.95, 1.0])
    return "min {:.3f}, 5% {:.3f}, median {:.3f}, 95% {:.3f}, max {:.3f}".format(*q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per mini-batch")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per mini-batch")
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--wrong-reward", type=int, default=-1, choices=(-1, 0))
    parser.add_argument("--no-filter", action="store_true", help="keep all-right and all-wrong groups")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the rows before splitting")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import recipe_apo.plugin  # noqa: F401  (imports verl the way the recipe does)

    torch.set_num_threads(1)  # small tensors: threads only contend
    rng = np.random.default_rng(args.seed)
    config = actor_config()
    cosines, ratios = [], []
    for _ in range(args.trials):
        old, new, advantages, mask = mini_batch(rng, args.prompts, args.n, args.max_len, args.no_filter,
                                                args.wrong_reward)
        order = rng.permutation(mask.shape[0]) if args.shuffle else np.arange(mask.shape[0])
        parts = np.array_split(order, args.micro)
        verl = gradient(old, new, advantages, mask, parts, config, global_tokens=True).flatten().double()
        authors = gradient(old, new, advantages, mask, parts, config, global_tokens=False).flatten().double()
        if verl.norm() > 0 and authors.norm() > 0:
            cosines.append(float(verl @ authors / (verl.norm() * authors.norm())))
            ratios.append(float(authors.norm() / verl.norm()))
    print(f"{args.trials} mini-batches of {args.prompts} x {args.n} (filter {'off' if args.no_filter else 'on'}, "
          f"wrong_reward {args.wrong_reward}), {args.micro} micro-batches{' shuffled' if args.shuffle else ''}, "
          f"lengths 1-{args.max_len}; {len(cosines)} with both gradients non-zero")
    print(f"cosine(authors', verl 0.9.1's):      {summary(np.array(cosines))}")
    print(f"norm ratio |authors'| / |verl 0.9.1's|: {summary(np.array(ratios))}")


if __name__ == "__main__":
    main()
