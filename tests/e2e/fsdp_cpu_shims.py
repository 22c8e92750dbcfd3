"""Make a test process a single-rank, CPU-only verl training worker, for FSDP2 steps without Ray.

The CPU platform and patches are the CPU rehearsal's own (``recipe_apo.cpu``); what a Ray worker would get
from verl's worker setup (rank variables, a process group) is set here. ``install()`` mutates process-wide
state (environment, ``torch.distributed``, verl's platform singleton), so call it only in a throwaway
subprocess, before anything imports ``verl.workers.engine`` (that module caches the device name at import time).
"""

from __future__ import annotations

import os
import socket

import torch


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def install() -> None:
    """Make this process a single-rank, CPU-only verl training worker."""
    # verl's Worker.__init__ reads these, and init_process_group's env:// rendezvous uses them.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    import recipe_apo.cpu.activate  # noqa: F401  (CPU platform, engine lookup, gloo)

    # An existing process group is reused as is by verl's worker.
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="gloo", rank=0, world_size=1)
