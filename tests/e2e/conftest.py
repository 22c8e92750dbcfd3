"""Every test in this folder runs verl's whole loop or a real FSDP2 step (Ray sessions, subprocesses): marked
``e2e`` so that ``pytest -m "not e2e"`` runs the rest of the suite in minutes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

STEPS_SCRIPT = Path(__file__).with_name("fsdp_cpu_steps.py")
# What fsdp_cpu_steps.py writes last (rank 0), and what the launcher writes once the run is over.
RESULT_FILE, STATUS_FILE = "result.json", "status.json"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def tiny(tiny_task):
    return tiny_task


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, chars: int) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


class FsdpSteps:
    """Runs of ``fsdp_cpu_steps.py`` (verl's FSDP2 worker on the CPU, one process per rank, gloo), each world
    size once per test run: the modules that read the same run share it, across xdist workers too (a file lock;
    the second one waits and reads)."""

    def __init__(self, root: Path):
        self.root = root

    def run(self, world_size: int, timeout: float = 300) -> Path:
        """The folder of the ``world_size``-rank run (result.json, params.pt); fails the test if the run failed."""
        from filelock import FileLock

        folder = self.root / f"dp{world_size}"
        with FileLock(f"{folder}.lock"):
            status_file = folder / STATUS_FILE
            if not status_file.exists():
                folder.mkdir(parents=True, exist_ok=True)
                status_file.write_text(json.dumps(self._launch(folder, world_size, timeout)))
            status = json.loads(status_file.read_text())
        if not status["ok"]:
            pytest.fail(status["report"], pytrace=False)
        return folder

    @staticmethod
    def _launch(folder: Path, world_size: int, timeout: float) -> dict:
        # Outer VERL_*/MASTER_* settings (VERL_PLATFORM, a launcher's rendezvous) must not steer the children,
        # and the shims assume a CPU-only process even where a GPU exists. One thread per rank: the ranks share
        # the machine's cores, and a fixed thread count keeps every run's float sums in the same order.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "MASTER_", "CUDA_"))}
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        port = str(_free_port())
        procs = []
        for rank in range(world_size):
            with open(folder / f"rank{rank}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, str(STEPS_SCRIPT), str(folder), str(rank), str(world_size), port],
                    stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder))
        codes = []
        try:
            for proc in procs:
                codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            codes.append(f"timeout after {timeout} s")
        finally:
            for proc in procs:  # a rank whose peer died waits in a collective: end it rather than orphan it
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        ok = all(code == 0 for code in codes) and (folder / RESULT_FILE).exists()
        report = "" if ok else f"fsdp_cpu_steps.py with {world_size} rank(s) failed: exit codes {codes}\n" + "".join(
            f"--- rank {rank} (last lines) ---\n{_tail(folder / f'rank{rank}.log', 6000)}\n"
            for rank in range(world_size))
        return {"ok": ok, "report": report}


@pytest.fixture(scope="session")
def fsdp_steps(tmp_path_factory) -> FsdpSteps:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return FsdpSteps(tmp_path_factory.mktemp("fsdp-steps"))
    # The run's folder, shared by its xdist workers.
    return FsdpSteps(tmp_path_factory.getbasetemp().parent / "fsdp-steps-shared")
