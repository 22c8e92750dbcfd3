"""What the CPU rehearsal cannot do, refused before Ray starts with one line naming the setting."""

from __future__ import annotations

from typing import Any, Callable

from omegaconf import OmegaConf

from recipe_apo.cpu import vllm_engine
from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.modes import verl_mode
from recipe_apo.integration.validation import REHEARSAL_ROLLOUT as ROLLOUT_NAME
from recipe_apo.integration.verl_settings import check_trainer_mode
from recipe_apo.methods.checks import check_integer


def _get(config: Any, dotted: str, default=None):
    value = OmegaConf.select(config, dotted, default=None)
    return default if value is None else value


# The engines the rehearsal runs: its own light backend, and verl's vLLM rollout on vLLM's CPU build.
ENGINES = (ROLLOUT_NAME, "vllm")


def _check_rollout(config: Any) -> None:
    """Refuses a rollout engine the rehearsal does not run (SGLang and TensorRT-LLM need a GPU), vllm without the
    CPU build installed (before Ray starts, rather than an import error in a Ray worker), or one split over
    several processes: the rehearsal runs one generation process per replica."""
    rollout = config.actor_rollout_ref.rollout
    if str(rollout.name) not in ENGINES:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.name={rollout.name}: the CPU rehearsal runs {' or '.join(ENGINES)} "
            f"(its own '{ROLLOUT_NAME}' backend, or verl's vLLM rollout on vLLM's CPU build); others need a GPU"
        )
    if str(rollout.name) == "vllm" and not vllm_engine.installed():
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.name=vllm: vLLM is not installed in this environment; "
            f"{vllm_engine.INSTALL_HINT}"
        )
    if str(rollout.name) == "vllm" and rollout.get("full_determinism", False) is True:
        # Measured: the engine dies at the first generation ("'function' object is not subscriptable" in
        # vllm/model_executor/layers/batch_invariant.py, a Triton kernel launched on the CPU).
        raise RecipeConfigError(
            "actor_rollout_ref.rollout.full_determinism=true with rollout.name=vllm: full determinism turns on "
            "vLLM's batch-invariant kernels, which are Triton GPU kernels, and vLLM's CPU engine dies at its first "
            f"generation; rehearse deterministic rollouts with rollout.name={ROLLOUT_NAME} (it honours the setting)"
        )
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        if check_integer(f"actor_rollout_ref.rollout.{key}", rollout.get(key, 1), RecipeConfigError) != 1:
            raise RecipeConfigError(
                f"actor_rollout_ref.rollout.{key}={rollout.get(key)}: the CPU rehearsal runs one generation "
                "process per replica; set it to 1"
            )


def _check_trainer_mode(config: Any) -> None:
    """Refuses a trainer mode verl's registry lacks (the launch's own check, which runs after these: an unknown
    name must not slip past the test below), and separate_async: its rollout pool takes the weights through a
    GPU transfer backend."""
    mode = verl_mode(check_trainer_mode(config))
    if mode == "separate_async":
        raise RecipeConfigError(
            "trainer.v1.trainer_mode=separate_async: its rollout pool takes the weights through a transfer backend "
            "(NCCL and the like: GPUs), which the CPU rehearsal does not have; rehearse with sync or colocate_async"
        )


def _check_workers(config: Any) -> None:
    """Refuses node, worker and Ray GPU counts that are not whole numbers (1.5 must not pass as 1), several nodes
    without a cluster to run them on, no FSDP worker, or fewer Ray GPUs than workers:
    each FSDP worker is one Ray worker holding one "GPU" of the CPU platform, so Ray must be told there are as
    many. Several nodes are several Ray nodes on this machine, started beforehand with their GPUs declared
    (``recipe_apo.cpu.local_cluster``); the run joins them through ``ray_kwargs.ray_init.address``."""
    nodes = check_integer("trainer.nnodes", config.trainer.nnodes, RecipeConfigError)
    workers = check_integer("trainer.n_gpus_per_node", config.trainer.n_gpus_per_node, RecipeConfigError)
    address = _get(config, "ray_kwargs.ray_init.address")
    if nodes < 1:
        raise RecipeConfigError(f"trainer.nnodes={nodes}: the rehearsal needs at least one node")
    if nodes > 1 and not address:
        raise RecipeConfigError(
            f"trainer.nnodes={nodes}: the CPU rehearsal runs several nodes as Ray nodes on this machine; start them "
            f"with `python -m recipe_apo.cpu.local_cluster start --nodes {nodes} --gpus-per-node {max(workers, 1)}` "
            "and add the overrides it prints (+ray_kwargs.ray_init.address=...)"
        )
    if workers < 1:
        raise RecipeConfigError(f"trainer.n_gpus_per_node={workers}: the rehearsal needs at least one FSDP worker")
    if address:
        return  # the cluster's nodes declared their GPUs; verl checks its resource pool against them
    ray_gpus = check_integer("ray_kwargs.ray_init.num_gpus", _get(config, "ray_kwargs.ray_init.num_gpus", 0),
                             RecipeConfigError)
    if ray_gpus < workers:
        raise RecipeConfigError(
            f"ray_kwargs.ray_init.num_gpus={ray_gpus} is below trainer.n_gpus_per_node={workers}: the CPU platform "
            "counts one GPU per FSDP worker; leave num_gpus to rehearsal=cpu (it follows n_gpus_per_node)"
        )


def _check_device(config: Any) -> None:
    """Refuses a trainer.device other than cpu: the rehearsal's workers hold their tensors in memory."""
    if str(config.trainer.device) != "cpu":
        raise RecipeConfigError(f"trainer.device={config.trainer.device}: the CPU rehearsal needs trainer.device=cpu")


def _check_strategy(config: Any) -> None:
    """Refuses an actor or ref strategy other than fsdp2: FSDP1 syncs module states on the GPU, Megatron needs CUDA."""
    for role in ("actor", "ref"):
        strategy = str(_get(config, f"actor_rollout_ref.{role}.strategy", "fsdp2"))
        if strategy != "fsdp2":
            raise RecipeConfigError(
                f"actor_rollout_ref.{role}.strategy={strategy}: on a CPU only fsdp2 runs (FSDP1 syncs module "
                "states on the GPU, Megatron needs CUDA)"
            )


def _check_cuda_kernels(config: Any) -> None:
    """Refuses flash attention and the model's fused kernels (flash-attn, Triton): they need CUDA."""
    attention = str(_get(config, "actor_rollout_ref.model.override_config.attn_implementation", "flash_attention_2"))
    if attention.startswith("flash"):
        raise RecipeConfigError(
            f"actor_rollout_ref.model.override_config.attn_implementation={attention} needs CUDA; use sdpa or eager"
        )
    model = config.actor_rollout_ref.model
    for key in ("use_remove_padding", "use_fused_kernels", "use_liger"):
        if bool(model.get(key, False)):
            raise RecipeConfigError(
                f"actor_rollout_ref.model.{key}=true needs CUDA kernels (flash-attn, Triton); set it to false"
            )


def _check_weight_handover(config: Any) -> None:
    """Refuses a checkpoint engine other than naive: the rehearsal hands weights over in memory."""
    backend = str(_get(config, "actor_rollout_ref.rollout.checkpoint_engine.backend", "naive"))
    if backend != "naive":
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend}: the CPU rehearsal hands weights over "
            "in memory; use naive"
        )


def _check_reward_model(config: Any) -> None:
    """Refuses a model-based reward: it needs its own vLLM/SGLang server, which the rehearsal does not run."""
    if bool(_get(config, "reward.reward_model.enable", False)):
        raise RecipeConfigError(
            "reward.reward_model.enable=true: a model-based reward needs its own vLLM/SGLang server, which the "
            "CPU rehearsal does not run; use a rule-based reward (reward.custom_reward_function)"
        )


# Run in this order by check_rehearsal_config; the first refusal stops the launch.
CHECKERS: tuple[Callable[[Any], None], ...] = (
    _check_rollout,
    _check_trainer_mode,
    _check_workers,
    _check_device,
    _check_strategy,
    _check_cuda_kernels,
    _check_weight_handover,
    _check_reward_model,
)


def check_rehearsal_config(config: Any) -> None:
    """Raise ``RecipeConfigError`` for the first setting a CPU rehearsal cannot honour."""
    for check in CHECKERS:
        check(config)
