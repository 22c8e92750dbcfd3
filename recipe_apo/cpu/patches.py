"""Where verl 0.9.1 cannot run on a CPU as shipped (or crawls), and what the rehearsal changes there.

Each patch replaces one name in verl's or torch's modules and in the modules that already imported it; each is
idempotent and applied only by ``recipe_apo.cpu.activate``, i.e. only in a rehearsal.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
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


# How often verl's sync trainer looks for finished rollouts (verl's fixed default: 2 s, a constant floor on the
# generation stage that GPU runs never notice and that would be most of a tiny model's step).
REPLAY_POLL_SECONDS = 0.05


def when_imported(module_name: str, patch) -> None:
    """Run ``patch(module)`` once ``module_name`` is imported (now, if it already is).

    For patches of modules that most processes never import: importing them eagerly in every Ray worker, as
    ``activate`` runs in all of them, would cost seconds of CPU each.
    """
    if module_name in sys.modules:
        patch(sys.modules[module_name])
        return

    class PatchOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != module_name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                patch(module)

            spec.loader.exec_module = exec_and_patch
            return spec

    if not any(isinstance(f, PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport())


def _quick_poll(replay_buffer) -> None:
    original = replay_buffer.ReplayBuffer.__init__
    if getattr(original, "_recipe_apo_quick", False):
        return

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        kwargs.setdefault("poll_interval", REPLAY_POLL_SECONDS)
        original(self, *args, **kwargs)

    init._recipe_apo_quick = True
    replay_buffer.ReplayBuffer.__init__ = init


def quick_replay_poll() -> None:
    """verl's ``ReplayBuffer`` waits ``poll_interval`` (2 s, not configurable) between looks at TransferQueue;
    the rehearsal's tiny model generates a batch in milliseconds. Same buffer, shorter wait (task runner only)."""
    when_imported("verl.trainer.ppo.v1.replay_buffer", _quick_poll)


def apply_all() -> None:
    gloo_process_group()
    unpinned_cpu_offload()
    quick_replay_poll()
