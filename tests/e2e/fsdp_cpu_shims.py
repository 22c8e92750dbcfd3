"""Make a test process one rank of a CPU-only verl training worker group, for FSDP2 steps without Ray.

The CPU platform and patches are the CPU rehearsal's own (``recipe_apo.cpu``); what a Ray worker would get
from verl's worker setup (rank variables, a process group) is set here. ``install()`` mutates process-wide
state (environment, ``torch.distributed``, verl's platform singleton), so call it only in a throwaway
subprocess, before anything imports ``verl.workers.engine`` (that module caches the device name at import time).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Optional

import torch


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def install(rank: int = 0, world_size: int = 1, port: Optional[int] = None) -> None:
    """Make this process rank ``rank`` of ``world_size`` CPU-only verl training workers (gloo).

    Every rank of a group must be given the same ``port`` (the launcher picks one with ``free_port``); a single
    rank picks its own.
    """
    if world_size > 1 and port is None:
        raise ValueError("the ranks of a group must share a rendezvous port")
    # verl's Worker.__init__ reads these, and init_process_group's env:// rendezvous uses them. Ray gives every
    # worker LOCAL_RANK 0 (verl's initialize_global_process_group_ray says so); here too.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port or free_port()), RANK=str(rank),
                      LOCAL_RANK="0", WORLD_SIZE=str(world_size))
    import recipe_apo.cpu.activate  # noqa: F401  (CPU platform, engine lookup, gloo)

    # An existing process group is reused as is by verl's worker. A rank whose peer died must fail, not hang
    # until the test's own timeout.
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="gloo", rank=rank, world_size=world_size,
                                             timeout=timedelta(seconds=120))
