"""A CPU platform for verl 0.9.1, which has none: with no accelerator, verl falls back to "nvidia".

Registered as ``cpu`` in verl's ``PlatformRegistry`` and selected with ``VERL_PLATFORM=cpu``. Every device call
in verl goes through the platform, so with this one FSDP2 meshes, autocast, ``.to()`` and the process group all
target the CPU and gloo.
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import torch
from verl.plugin.platform import PlatformBase

NAME = "cpu"
# The ports the rehearsal's processes bind by number, above Ray's worker ports (10002-19999 by default) and below
# Linux's ephemeral range (32768 and up), which outgoing connections never get. Base ports of the vLLM engines
# (start, stop, step): each engine scans at most a few ports up from its base. Then the rendezvous ports of verl's
# worker groups (patches.rendezvous_ports), apart from the engines'.
VLLM_PORT_SLOTS = (20000, 28000, 40)
RENDEZVOUS_PORTS = (28000, 32768)


def _zero(*args, **kwargs) -> int:
    return 0


def _nothing(*args, **kwargs) -> None:
    return None


class CPUDeviceModule:
    """``torch.cpu`` plus what verl asks of a device module unconditionally (memory logging, RNG state, caches)."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(*args, **kwargs) -> str:
        return "cpu"

    @staticmethod
    def mem_get_info(*args, **kwargs) -> tuple[int, int]:
        return 0, 0

    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(_zero)
    empty_cache = reset_peak_memory_stats = ipc_collect = staticmethod(_nothing)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)
    manual_seed = manual_seed_all = staticmethod(torch.manual_seed)


class PlatformCPU(PlatformBase):
    """Device ``cpu``, backend ``gloo``.

    Ray resources: verl's resource pools always ask for one accelerator per worker and count only ``GPU`` (or
    ``NPU``) when checking the cluster, so this platform names ``GPU`` and the rehearsal declares one fake GPU
    to Ray (``ray_kwargs.ray_init.num_gpus=1``). Ray then sets ``CUDA_VISIBLE_DEVICES`` in the workers, which
    nothing on the CPU reads.
    """

    def __init__(self):
        self._module = CPUDeviceModule()

    device_name = property(lambda self: NAME)
    vendor_name = property(lambda self: NAME)
    device_module = property(lambda self: self._module)

    def is_available(self) -> bool:
        return True

    def current_device(self):
        # verl passes this to `.to(...)` and `torch.device(...)`: an int would mean cuda:N.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def rollout_env_vars(self) -> dict[str, str]:
        """Each vLLM engine's base port (``VLLM_PORT``), drawn per engine from below the kernel's ephemeral ports.

        vLLM picks its worker's process-group port as a free ephemeral port, releases it, and binds it again once
        the worker process has started: seconds later on a loaded 2-core machine, long enough for another
        process's ephemeral socket (Ray's, ZMQ's, another engine's) to take it (seen: ``EADDRINUSE`` with two
        runs side by side). From ``VLLM_PORT`` vLLM scans upward instead, in a range no ephemeral socket uses;
        a random slot per engine keeps the engines of one run, and of runs side by side, apart.
        """
        return {"VLLM_PORT": str(random.SystemRandom().randrange(*VLLM_PORT_SLOTS))}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None
