"""What the CPU rehearsal cannot do, refused before Ray starts with one line naming the setting."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from recipe_apo.integration.modes import verl_mode
from recipe_apo.integration.validation import REHEARSAL_ROLLOUT as ROLLOUT_NAME
from recipe_apo.integration.validation import RecipeConfigError


def _get(config: Any, dotted: str, default=None):
    value = OmegaConf.select(config, dotted, default=None)
    return default if value is None else value


def check_rehearsal_config(config: Any) -> None:
    """Raise ``RecipeConfigError`` for the first setting a CPU rehearsal cannot honour."""
    rollout = config.actor_rollout_ref.rollout
    if str(rollout.name) != ROLLOUT_NAME:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.name={rollout.name}: the CPU rehearsal generates with its own "
            f"'{ROLLOUT_NAME}' backend (vLLM and SGLang need a GPU); leave rollout.name to rehearsal=cpu"
        )
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        if int(rollout.get(key, 1)) != 1:
            raise RecipeConfigError(
                f"actor_rollout_ref.rollout.{key}={rollout.get(key)}: the CPU rehearsal runs one generation "
                "process per replica; set it to 1"
            )
    mode = verl_mode(str(_get(config, "trainer.v1.trainer_mode", "sync")))
    if mode == "separate_async":
        raise RecipeConfigError(
            "trainer.v1.trainer_mode=separate_async: its rollout pool takes the weights through a transfer backend "
            "(NCCL and the like: GPUs), which the CPU rehearsal does not have; rehearse with sync or colocate_async"
        )
    if int(config.trainer.nnodes) != 1:
        raise RecipeConfigError(f"trainer.nnodes={config.trainer.nnodes}: the CPU rehearsal runs on one machine")
    workers = int(config.trainer.n_gpus_per_node)
    if workers < 1:
        raise RecipeConfigError(f"trainer.n_gpus_per_node={workers}: the rehearsal needs at least one FSDP worker")
    # Each FSDP worker is one Ray worker holding one "GPU" of the CPU platform: Ray must be told there are as many.
    ray_gpus = _get(config, "ray_kwargs.ray_init.num_gpus", 0)
    if int(ray_gpus) < workers:
        raise RecipeConfigError(
            f"ray_kwargs.ray_init.num_gpus={ray_gpus} is below trainer.n_gpus_per_node={workers}: the CPU platform "
            "counts one GPU per FSDP worker; leave num_gpus to rehearsal=cpu (it follows n_gpus_per_node)"
        )
    if str(config.trainer.device) != "cpu":
        raise RecipeConfigError(f"trainer.device={config.trainer.device}: the CPU rehearsal needs trainer.device=cpu")
    for role in ("actor", "ref"):
        strategy = str(_get(config, f"actor_rollout_ref.{role}.strategy", "fsdp2"))
        if strategy != "fsdp2":
            raise RecipeConfigError(
                f"actor_rollout_ref.{role}.strategy={strategy}: on a CPU only fsdp2 runs (FSDP1 syncs module "
                "states on the GPU, Megatron needs CUDA)"
            )
    model = config.actor_rollout_ref.model
    attention = str(_get(config, "actor_rollout_ref.model.override_config.attn_implementation", "flash_attention_2"))
    if attention.startswith("flash"):
        raise RecipeConfigError(
            f"actor_rollout_ref.model.override_config.attn_implementation={attention} needs CUDA; use sdpa or eager"
        )
    for key in ("use_remove_padding", "use_fused_kernels", "use_liger"):
        if bool(model.get(key, False)):
            raise RecipeConfigError(
                f"actor_rollout_ref.model.{key}=true needs CUDA kernels (flash-attn, Triton); set it to false"
            )
    backend = str(_get(config, "actor_rollout_ref.rollout.checkpoint_engine.backend", "naive"))
    if backend != "naive":
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}: the CPU rehearsal hands weights over "
            "in memory; use naive"
        )
    if bool(_get(config, "reward.reward_model.enable", False)):
        raise RecipeConfigError(
            "reward.reward_model.enable=true: a model-based reward needs its own vLLM/SGLang server, which the "
            "CPU rehearsal does not run; use a rule-based reward (reward.custom_reward_function)"
        )
