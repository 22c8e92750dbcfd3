"""The three places where verl 0.9.1 cannot run on a CPU as shipped, and what the rehearsal changes there.

Each patch replaces one name in verl's or torch's modules and in the modules that already imported it; each is
idempotent and applied only by ``recipe_apo.cpu.activate``, i.e. only in a rehearsal.
"""

from __future__ import annotations

import functools
import os
import sys

# verl picks the FSDP training engine by device, and registers it for cuda and npu only; the engine itself is
# device-agnostic (every device call goes through the platform), so the rehearsal asks for the cuda entry.
# VERL_ENGINE_DEVICE is verl's own override of that lookup (verl/workers/engine/base.py).
ENGINE_DEVICE_ENV = {"VERL_ENGINE_DEVICE": "cuda"}


def _replace(module_name: str, attr: str, value) -> None:
    module = sys.modules.get(module_name)
    if module is not None and hasattr(module, attr):
        setattr(module, attr, value)


def gloo_process_group() -> None:
    """verl's workers join ``cpu:gloo,<device>:<backend>``; with device ``cpu`` that is ``cpu:gloo,cpu:gloo``,
    which torch rejects ("Duplicate device type cpu"). Pass plain ``gloo`` unless a caller names a backend."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_recipe_apo_gloo", False):
        return

    @functools.wraps(original)
    def initialize_gloo(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_gloo._recipe_apo_gloo = True
    distributed.initialize_global_process_group_ray = initialize_gloo
    # engine_workers imports the function by name; patch its copy too if it is already loaded.
    _replace("verl.workers.engine_workers", "initialize_global_process_group_ray", initialize_gloo)


def unpinned_cpu_offload() -> None:
    """verl's FSDP2 engine builds the reference model (and any forward-only engine) with
    ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator. Same policy, unpinned."""
    import torch.distributed.fsdp as fsdp

    if getattr(fsdp.CPUOffloadPolicy, "_recipe_apo_unpinned", False):
        return
    pinned = fsdp.CPUOffloadPolicy

    class UnpinnedCPUOffloadPolicy(pinned):
        _recipe_apo_unpinned = True

        def __init__(self, pin_memory: bool = False):
            super().__init__(pin_memory=False)

    fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    for module_name in ("verl.utils.fsdp_utils", "verl.workers.engine.fsdp.transformer_impl"):
        _replace(module_name, "CPUOffloadPolicy", UnpinnedCPUOffloadPolicy)


def engine_device() -> None:
    for key, value in ENGINE_DEVICE_ENV.items():
        os.environ.setdefault(key, value)


def apply_all() -> None:
    gloo_process_group()
    unpinned_cpu_offload()
    engine_device()
