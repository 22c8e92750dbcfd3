"""What verl's generation server (``python -m verl.trainer.main_generation_server``, the generation stage of
``scripts/evaluate.py``) needs to run on a machine without a GPU: the settings and environment of the CPU
rehearsal, for a standalone server.

``scripts/evaluate.py`` asks ``cpu_generation(replicas)`` when torch sees no CUDA device, so its command runs on a
CPU as written for a GPU: verl's vLLM rollout on vLLM's CPU build where it is installed (``.venv-vllm``), else the
rehearsal's ``hf`` rollout; verl's CPU platform and patches in every process (``recipe_apo.cpu.activate``); Ray
told of one "GPU" per replica, the name the CPU platform gives its workers.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from recipe_apo.cpu import vllm_engine

# conf/rehearsal/cpu.yaml's rollout settings that a generation server reads, for vLLM's CPU build: no sleep mode
# (the CPU build has none), eager mode, fp32 as in training.
VLLM_SETTINGS = (
    "+actor_rollout_ref.rollout.enable_sleep_mode=false",
    "actor_rollout_ref.rollout.free_cache_engine=false",
    "actor_rollout_ref.rollout.dtype=float32",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
)
# verl's default attention is flash_attention_2, which has no CPU kernel.
MODEL_SETTINGS = ("+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "trainer.device=cpu")
# GiB of RAM for a vLLM engine's KV cache (vLLM's default, 4, is more than a small evaluation needs).
KV_CACHE_GIB = "1"


def has_gpu() -> bool:
    """Whether torch sees a CUDA device here."""
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def engine() -> str:
    """The rollout a CPU generation uses: vLLM's CPU build where installed, else the rehearsal's ``hf``."""
    return "vllm" if vllm_engine.installed() else "hf"


def threads_env(cores: Optional[int] = None) -> dict[str, str]:
    """Every core for the one process that computes at a time (the engine while it generates, the actor while it
    trains): vLLM's CPU build otherwise keeps one core for its front end and binds its worker to the rest, which on
    2 cores halves generation (191 against 304 tokens/s measured here, docs/real.md); torch in Ray's workers
    otherwise gets Ray's default of one thread."""
    cores = cores or os.cpu_count() or 1
    return {"OMP_NUM_THREADS": str(cores), "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def cpu_generation(replicas: int) -> tuple[list[str], dict[str, str]]:
    """The overrides and the environment of a generation server on this CPU with ``replicas`` replicas."""
    from recipe_apo.cpu.activate import DRIVER_ENV, ENV
    from recipe_apo.integration import quiet

    chosen = engine()
    overrides = [f"actor_rollout_ref.rollout.name={chosen}", *MODEL_SETTINGS,
                 *(VLLM_SETTINGS if chosen == "vllm" else ())]
    env = {**quiet.child_env(os.environ), **ENV, **DRIVER_ENV,
           **threads_env(), "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
           # main_generation_server's ray.init() starts a local cluster, which reads this node's resources here:
           # one "GPU" per replica (the CPU platform's resource name); more CPUs than cores (Ray only counts them).
           "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": 16, "GPU": replicas})}
    env.pop("RAY_ADDRESS", None)  # never join a cluster someone else started
    return overrides, env
