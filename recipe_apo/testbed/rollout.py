"""One round's data, the way verl's trainer builds it: G samples per prompt, rewards, then advantages from
verl's own ``compute_advantage`` on a real ``DataProto`` with the registered estimator named in the config."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.testbed.policy import TokenPolicy, response_mask
from recipe_apo.testbed.task import Task


def rollout(
    policy: TokenPolicy,
    task: Task,
    prompts: torch.Tensor,
    k: torch.Tensor,
    group_size: int,
    generator: torch.Generator,
    temperature: Optional[torch.Tensor] = None,
) -> dict[str, Any]:
    """Sample ``group_size`` responses per prompt (rows of a group are adjacent) and score them; ``temperature``
    (one per prompt, AGPO's tau_t) samples each prompt's responses at its own, else at temperature 1."""
    prompts = prompts.repeat_interleave(group_size, dim=0)
    k = k.repeat_interleave(group_size, dim=0)
    if temperature is not None:
        temperature = torch.as_tensor(temperature).reshape(-1).repeat_interleave(group_size)
    responses = policy.sample(prompts, task.max_response_length, generator, temperature)
    scored = task.score(prompts, k, responses)
    mask = response_mask(responses)
    # verl puts the sequence reward on the last valid token; estimators sum token rewards back to R_i.
    token_level_rewards = torch.zeros_like(mask)
    token_level_rewards[torch.arange(len(responses)), scored["length"] - 1] = scored["reward"]
    n_prompts = prompts.shape[0] // group_size
    uid = np.repeat(np.array([f"p{i}" for i in range(n_prompts)], dtype=object), group_size)
    return {
        "prompts": prompts,
        "k": k,
        "responses": responses,
        "response_mask": mask,
        "token_level_rewards": token_level_rewards,
        "uid": uid,
        **scored,
    }


def compute_advantages(batch: dict[str, Any], algorithm: Any) -> torch.Tensor:
    """verl's ``compute_advantage`` with ``algorithm.adv_estimator`` (any registered name), [n, L0].

    ``algorithm`` is the composed ``algorithm`` node, passed as verl's trainer passes it: the apo estimator
    reads its ``apo`` child, verl's ``grpo`` branch takes ``norm_adv_by_std_in_grpo`` from it.
    """
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    data = DataProto.from_dict(
        tensors={"token_level_rewards": batch["token_level_rewards"], "response_mask": batch["response_mask"]},
        non_tensors={"uid": batch["uid"]},
    )
    data = compute_advantage(
        data,
        adv_estimator=algorithm.adv_estimator,
        gamma=algorithm.get("gamma", 1.0),
        lam=algorithm.get("lam", 1.0),
        norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
        config=algorithm,
    )
    return data.batch["advantages"]
