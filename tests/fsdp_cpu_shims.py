"""Shims that let verl 0.9.1's FSDP2 training engine run in a CPU-only process, for tests.

verl has no CPU platform: its engines register only for ``cuda``/``npu``, its worker initialises a
``cpu:gloo,<device>:<backend>`` process group, and it asks the device module for memory statistics.
``install()`` mutates process-wide state (environment, ``torch.distributed``, verl's platform
singleton), so call it only in a throwaway subprocess, before anything imports
``verl.workers.engine`` (that module caches the device name at import time).
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager

import torch
from verl.plugin.platform import PlatformBase, set_platform


class _CPUDeviceModule:
    """``torch.cpu`` plus the allocator queries verl makes unconditionally (memory logging, perf metrics)."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(*args, **kwargs) -> str:
        return "cpu"

    @staticmethod
    def mem_get_info(*args, **kwargs) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def _zero(*args, **kwargs) -> int:
        return 0

    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = _zero


class PlatformCPU(PlatformBase):
    """Device "cpu" for verl's device helpers: FSDP2 meshes, autocast and `.to()` then all target the CPU.

    Installed with ``set_platform`` rather than registered by name: nothing in verl looks a platform up by
    name once the singleton is set, and a registry entry would only be dead weight.
    """

    def __init__(self):
        self._module = _CPUDeviceModule()

    device_name = property(lambda self: "cpu")
    vendor_name = property(lambda self: "cpu")
    device_module = property(lambda self: self._module)

    def is_available(self) -> bool:
        return True

    def current_device(self):
        # verl passes this to `.to(...)`/`torch.device(...)`; an int would mean cuda:N.
        return "cpu"

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
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def install() -> None:
    """Make this process a single-rank, CPU-only verl training worker."""
    # verl's Worker.__init__ reads these, and init_process_group's env:// rendezvous uses them.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        # EngineRegistry holds engines for cuda/npu only; this is verl's own override of its device lookup
        # (the engine class is device-agnostic; every device call goes through the platform below).
        VERL_ENGINE_DEVICE="cuda",
    )
    set_platform(PlatformCPU())
    # verl would initialise "cpu:gloo,cpu:gloo", which torch rejects; an existing group is reused as is.
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="gloo", rank=0, world_size=1)
