"""Where verl 0.9.1 cannot run on a CPU as shipped (or crawls), and what the rehearsal changes there.

Each patch replaces one name in verl's or torch's modules and in the modules that already imported it; each is
idempotent and applied only by ``recipe_apo.cpu.activate``, i.e. only in a rehearsal.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import random
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


# Ports verl's range scan tries from a start (platform.RENDEZVOUS_PORTS holds the starts and the range's end).
RENDEZVOUS_SPAN = 200


def rendezvous_port_range(ephemeral_low: int | None = None, rng: random.Random | None = None) -> list[int] | None:
    """A ``[first, last)`` range for verl's ``master_port_range``: a random start in ``platform.RENDEZVOUS_PORTS``,
    below the kernel's ephemeral range, or None (verl's own choice) where that range leaves no room."""
    from recipe_apo.cpu.platform import RENDEZVOUS_PORTS

    if ephemeral_low is None:
        ephemeral_low = _ephemeral_low()
    top = min(RENDEZVOUS_PORTS[1], ephemeral_low)
    if top - RENDEZVOUS_SPAN <= RENDEZVOUS_PORTS[0]:
        return None
    first = (rng or random.SystemRandom()).randrange(RENDEZVOUS_PORTS[0], top - RENDEZVOUS_SPAN)
    return [first, first + RENDEZVOUS_SPAN]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _rendezvous_ports(base) -> None:
    group = base.RayWorkerGroup
    original = group.__init__
    if getattr(original, "_recipe_apo_ports", False):
        return

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        if kwargs.get("master_port_range") is None:
            kwargs["master_port_range"] = rendezvous_port_range()
        original(self, *args, **kwargs)

    init._recipe_apo_ports = True
    group.__init__ = init


def rendezvous_ports() -> None:
    """verl picks a worker group's rendezvous port by binding port 0 and closing it; the workers bind it seconds
    later. With two runs on one machine (the e2e suite's two workers) the other run's outgoing connections can take
    the port in between (CI: ``EADDRINUSE`` in ``init_process_group``). Ports below the ephemeral range are never
    handed to outgoing connections, and a random start keeps two runs apart (verl's ``master_port_range``, which
    its trainer never sets)."""
    when_imported("verl.single_controller.ray.base", _rendezvous_ports)


def apply_all() -> None:
    gloo_process_group()
    rendezvous_ports()
    unpinned_cpu_offload()
    quick_replay_poll()
