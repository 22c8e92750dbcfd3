"""Whether processes still run, asked on their own node by the engine watch (``engine_watch``) as a Ray task: a
module that imports nothing else, so the task's Ray worker starts without torch or verl."""

from __future__ import annotations

import os


def processes_gone(pids: tuple[int, ...]) -> list[int]:
    """Run on the engines' node: which of ``pids`` no longer run. A killed child its parent has not reaped yet is a
    zombie (``Z`` in ``/proc/<pid>/stat``): gone too."""
    gone = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            gone.append(pid)
            continue
        except OSError:  # no /proc here: only whether the process exists
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                gone.append(pid)
            except PermissionError:
                pass
            continue
        if state in ("Z", "X"):
            gone.append(pid)
    return gone
