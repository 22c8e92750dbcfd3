"""R2PO's advantages as its released code computes them (RRPO-ARR/Code at 8a2cc4d, simple_grpo_v1/), written here
from their definitions, one group at a time in float32 as the source does (its batch is one group): the oracle the
vectorized estimators are checked against."""

from __future__ import annotations

import torch


def reward_rarity(rewards: torch.Tensor) -> torch.Tensor:
    """``rollout_head_train.py::reward_rarity`` of one group's rewards: s_i = 1 / how many rewards of the group equal
    R_i; all s equal: s - mean s (zeros, and the caller skips the group); else (s - mean s) / (std s + 1e-6)."""
    values, counts = rewards.unique(return_counts=True)
    frequency = {value: count for value, count in zip(values.tolist(), counts.tolist())}
    s = torch.tensor([1.0 / frequency[value] for value in rewards.tolist()], dtype=torch.float32)
    centered = s - s.mean()
    if bool((centered == 0).all()):
        return centered
    return centered / (s.std() + 1e-6)


def policy_advantage(rewards: torch.Tensor) -> torch.Tensor:
    """``adaptor_grpo_split.py``'s policy-phase advantage of one group: zeros where the source skips the group
    (max - min < 0.01), else (R - mean) / (std + 1e-4)."""
    rewards = rewards.to(torch.float32)
    if float(rewards.max() - rewards.min()) < 0.01:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)
