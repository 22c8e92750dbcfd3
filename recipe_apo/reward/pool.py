"""The reward's worker pool: long-lived ``recipe_apo.reward.worker`` processes shared by all threads of a
process, with the time bound enforced from outside (a worker that overruns is killed and replaced)."""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from typing import Optional

from recipe_apo.errors import RecipeError
from recipe_apo.reward import worker as _worker_module
from recipe_apo.reward.settings import DEFAULT_MEMORY_MB, MEMORY_ENV, env_settings

logger = logging.getLogger("recipe_apo.reward")

# Worker start-up (interpreter + sympy import) does not count against a request's timeout.
WORKER_START_TIMEOUT_S = 120.0


def _op_timeout(timeout: float) -> int:
    # Three signal-timed operations share one request's budget: parse the answer, parse a gold, verify.
    return max(1, int(timeout // 3))


# --------------------------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------------------------

# Loads the worker's file by path (not `import recipe_apo`, which imports verl and torch: seconds and hundreds of MB
# per worker) and serves. The working directory is dropped from sys.path so that nothing in the caller's
# working directory shadows a library.
_WORKER_BOOT = (
    "import sys, importlib.util\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
    "spec = importlib.util.spec_from_file_location('_recipe_apo_reward_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module._worker_main()\n"
)
class WorkerError(RecipeError, RuntimeError):
    """A worker could not be started or answered nothing usable."""


class _Worker:
    def __init__(self, memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        env = dict(os.environ)
        env["RECIPE_APO_REWARD_PARENT"] = str(os.getpid())
        env[MEMORY_ENV] = str(memory_mb)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, os.path.abspath(_worker_module.__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            # Its own session: a Ctrl-C in the terminal reaches the trainer, which then closes the worker.
            start_new_session=True,
        )
        self._buffer = b""
        reply = self._read_line(WORKER_START_TIMEOUT_S)
        if reply is None or not reply.get("ready"):
            error = (reply or {}).get("error", "no answer")
            self.kill()
            raise WorkerError(f"reward worker did not start: {error}")

    def _read_line(self, timeout: float) -> Optional[dict]:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # the worker died
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def request(self, golds: list[str], pred: str, timeout: float, op_timeout: Optional[int] = None) -> Optional[float]:
        """The score, or None when the worker overran ``timeout`` or died (the caller then kills it).
        ``op_timeout``: math-verify's own per-operation limit inside the worker (default: a third of ``timeout``)."""
        op_timeout = _op_timeout(timeout) if op_timeout is None else op_timeout
        message = json.dumps({"golds": golds, "pred": pred, "op_timeout": op_timeout}) + "\n"
        try:
            self.proc.stdin.write(message.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        reply = self._read_line(timeout)
        if reply is None:
            return None
        return float(reply.get("score", 0.0))

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except Exception:
                pass


class VerifierPool:
    """Up to ``size`` workers shared by all threads of this process; started on first use."""

    def __init__(self, size: int, memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        self.size = max(1, size)
        self.memory_mb = memory_mb
        # The longest check of one answer so far (what ``timeout`` bounds), for tests and benchmarks.
        self.longest_check_s = 0.0
        self._start_error: Optional[WorkerError] = None
        self.pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.size)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self.start_failures = 0
        self.kills = 0

    def score(self, golds: list[str], pred: str, timeout: float, op_timeout: Optional[int] = None) -> float:
        with self._slots:
            worker = self._take()
            started = time.monotonic()
            result = worker.request(golds, pred, timeout, op_timeout)
            self.longest_check_s = max(self.longest_check_s, time.monotonic() - started)
            if result is None:
                self._discard(worker)
                self.kills += 1
                logger.info("reward worker overran %.1fs on an answer of %d chars; replaced", timeout, len(pred))
                return 0.0
            with self._lock:
                self._idle.append(worker)
            return result

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                self._all.discard(worker)
        if self._start_error is not None:
            raise self._start_error  # once failed, not retried on every call (each try can take minutes)
        try:
            worker = _Worker(self.memory_mb)
        except WorkerError as exc:
            self.start_failures += 1
            self._start_error = WorkerError(
                f"recipe_apo.reward: {exc}; math-verify cannot run with its time bound, so answers are not scored "
                f"(check that subprocesses can start and math-verify imports; {MEMORY_ENV} too small?)"
            )
            raise self._start_error from None
        with self._lock:
            self._all.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = list(self._all), set(), []
        if os.getpid() != self.pid:
            return  # inherited through fork: the workers belong to the parent
        for worker in workers:
            worker.kill()


_POOL: Optional[VerifierPool] = None
_POOL_LOCK = threading.Lock()


def _pool() -> VerifierPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # a forked child starts its own workers
            settings = env_settings()
            _POOL = VerifierPool(int(settings["workers"]), int(settings["memory_mb"]))
        return _POOL


def shutdown() -> None:
    """Stop this process's reward workers (they also stop with the process)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


atexit.register(shutdown)
