"""A watch on the run's rollout servers from the driver: a dead engine ends the run with one line, not a hang.

When a vLLM engine process dies mid-run, verl 0.9.1's weight sender (in the FSDP workers) waits forever for the
engine's ZMQ reply, and the run never ends; this happens on GPUs as on the CPU. verl has no setting that bounds
that wait, so the recipe watches from the driver: every ``rollout_watch.interval_s`` seconds it asks each of the
run's rollout server actors (verl names them ``<engine>_server_<replica>_<node>``) whether its engine is alive.
A server whose engine reports itself dead (vLLM's ``AsyncLLM.errored``), whose actor has died, or which answered
once and then has not answered for ``rollout_watch.timeout_s`` ends the run: the watch interrupts the driver,
which shuts Ray down (the hung workers with it) and says one ``recipe-apo: error:`` line naming the server and
where its log is, exit status 1. A probe is sent at one look and read at the next, so a dead engine ends the run
within two intervals (10 s by default), an unresponsive one within ``timeout_s`` and two intervals (2 min 10 s).

A server answers on its event loop (Ray runs ``__ray_call__`` there: measured, a probe to an actor whose loop was
busy 20 s answered after 19 s), which a loaded machine can block for minutes; a run whose engine was killed once
went 8 minutes without its line under a full ``make test-vllm``, which a blocked loop would explain (the log did
not say). So the watch also checks the engine processes
themselves, apart from the server: a server's first answer names its engine core processes (vLLM's engine
manager's) and its Ray node, and at each look a small Ray task on that node says whether they still run; one gone
ends the run the same way. A failing look never stops the watch, and an interrupt the driver has not acted on is
sent again every ``RESEND_S`` seconds.
"""

from __future__ import annotations

import _thread
import functools
import logging
import re
import signal
import threading
import time
from typing import Any, Callable, Optional

from recipe_apo.integration.engine_processes import processes_gone
from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.methods.checks import check_number

# verl's rollout servers (vLLM's, SGLang's, the rehearsal's hf one): <engine>_server_[reward_|teacher_]<rank>_<node>.
SERVER_NAME = re.compile(r"^([A-Za-z0-9]+)_server_(?:reward_|teacher_)?\d+_\d+")
DEAD_ENGINE = "its engine process has died"
# Seconds between interrupts the driver's main thread has not acted on (a library that caught the first one).
RESEND_S = 30.0
logger = logging.getLogger(__name__)


def interrupt_main_thread() -> None:
    """A KeyboardInterrupt in the main thread, also when it sits in a blocking C call: SIGINT sent to that thread
    itself ends its system call (EINTR) and Python's handler then raises. ``_thread.interrupt_main`` only sets the
    flag the main thread checks when it next runs Python code or polls for signals: a driver blocked in a call
    that does neither never saw it (measured: a run with a dead engine hung 600 s under load, the watch done). Used
    only while SIGINT has Python's handler; otherwise the flag, as before (a real signal would kill the process)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:
        _thread.interrupt_main(signal.SIGINT)


def engine_state(server: Any) -> Optional[str]:
    """Run inside a server actor: what is wrong with its engine, or None. vLLM's engine client says ``errored``
    once its engine core process has died; a server whose engine has not started yet has none to ask."""
    engine = getattr(server, "engine", None)
    if engine is not None and bool(getattr(engine, "errored", False)):
        return DEAD_ENGINE
    return None


def engine_report(server: Any) -> tuple[Optional[str], Optional[str], tuple[int, ...]]:
    """Run inside a server actor (the watch's probe): ``engine_state``, this Ray node's id, and the process ids of
    its engine cores (vLLM's ``AsyncLLM.engine_core.resources.engine_manager.processes``; none for an engine kept
    elsewhere, in Ray actors or another host, or not started yet)."""
    import ray

    manager = getattr(getattr(getattr(getattr(server, "engine", None), "engine_core", None), "resources", None),
                      "engine_manager", None)
    pids = tuple(process.pid for process in getattr(manager, "processes", None) or () if process.pid is not None)
    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    return engine_state(server), node, pids


def processes_state(gone: Any) -> Optional[str]:
    """A liveness task's answer as the watch judges it: the pids gone (``processes_gone``), or None when the task
    could not run (no verdict)."""
    return DEAD_ENGINE if isinstance(gone, list) and gone else None


@functools.cache
def _remote_processes_gone():
    """``processes_gone`` as a Ray task, made once per driver (each remote function is exported to the cluster)."""
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(processes_gone)


class EngineWatch:
    """``with EngineWatch(interval_s, timeout_s): run_ppo(...)``; after an interruption, ``failure`` says why."""

    def __init__(self, interval_s: float, timeout_s: float, interrupt: Callable[[], None] = None):
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.failure: Optional[str] = None
        self._interrupt = interrupt or interrupt_main_thread
        self._stop = threading.Event()
        self._pending: dict[str, tuple[Any, float]] = {}  # server -> (its probe under way, when it was sent)
        self._answered: set[str] = set()
        self._seen: set[str] = set()  # every server listed at some look: one no longer listed has died
        self._engines: dict[str, tuple[str, tuple[int, ...]]] = {}  # server -> (its node, its engine processes)
        self._process_checks: dict[str, Any] = {}  # server -> its engines' liveness task under way
        self._thread = threading.Thread(target=self._watch, name="recipe-apo-engine-watch", daemon=True)

    @classmethod
    def from_config(cls, config: Any) -> "EngineWatch":
        settings = config.get("rollout_watch") or {}
        unknown = sorted(set(settings) - {"interval_s", "timeout_s"})
        if unknown:
            raise RecipeConfigError(f"rollout_watch.{unknown[0]}: not a setting of the engine watch; its settings: "
                                    "interval_s, timeout_s")
        return cls(*checked_settings(settings.get("interval_s", 5), settings.get("timeout_s", 120)))

    def __enter__(self) -> "EngineWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + self.interval_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                failure = self.check()
            except Exception as exc:  # a look that failed (Ray busy or shutting down) is no verdict; the next may be
                logger.warning("recipe-apo engine watch: a look failed: %r", exc)
                continue
            if failure and not self._stop.is_set():
                self.failure = failure
                self._interrupt()
                while not self._stop.wait(RESEND_S):
                    self._interrupt()
                return

    def check(self) -> Optional[str]:
        """One look at every rollout server of this Ray job: the first failure's message, or None.

        Looks never block: each server has at most one probe under way, sent at one look and read at a later one.
        A server that is still starting its engine (vLLM's start blocks the server's event loop for minutes on a
        loaded machine) has not answered yet and is not judged on time; once it has answered, a probe left
        unanswered for ``timeout_s`` is a failure."""
        import ray

        if not ray.is_initialized():
            return None
        try:
            names = sorted(name for name in ray.util.list_named_actors() if SERVER_NAME.match(name))
        except Exception:  # Ray shutting down: nothing left to watch
            return None
        now = time.monotonic()
        self._seen.update(names)
        for name in names:
            state = self._look(name, now)
            if state is not None:
                return failure_message(name, state)
        return None

    def _look(self, name: str, now: float) -> Optional[str]:
        state = self._look_server(name, now)
        return state if state is not None else self._look_processes(name)

    def _look_server(self, name: str, now: float) -> Optional[str]:
        if name not in self._pending:
            probe = self._send(name)
            if probe is not None:
                self._pending[name] = (probe, now)
            return None
        probe, sent = self._pending[name]
        answered, report = self._read(probe)
        if answered:
            del self._pending[name]
            self._answered.add(name)
            if not isinstance(report, tuple):  # the actor died: _read's own line
                return report
            state, node, pids = report
            if pids:
                self._engines[name] = (node, pids)
            return state
        if name in self._answered and now - sent > self.timeout_s:
            return f"it has not answered for {self.timeout_s:g} s (rollout_watch.timeout_s)"
        return None

    def _look_processes(self, name: str) -> Optional[str]:
        """The engine processes the server named, looked at on their node apart from the server's event loop."""
        if name not in self._engines:
            return None
        if name not in self._process_checks:
            check = self._send_process_check(*self._engines[name])
            if check is not None:
                self._process_checks[name] = check
            return None
        answered, gone = self._read(self._process_checks[name])
        if not answered:
            return None
        del self._process_checks[name]
        return processes_state(gone)

    @staticmethod
    def _send_process_check(node: str, pids: tuple[int, ...]):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            on_node = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            return _remote_processes_gone().options(scheduling_strategy=on_node).remote(pids)
        except Exception:  # the node is gone or Ray is shutting down: the server's probe decides
            return None

    @staticmethod
    def _send(name: str):
        import ray

        try:
            return ray.get_actor(name).__ray_call__.remote(engine_report)
        except ValueError:
            return None  # gone between the listing and the lookup: the run is tearing it down

    @staticmethod
    def _read(probe, wait_s: float = 0.0) -> tuple[bool, Any]:
        import ray
        from ray.exceptions import RayActorError, RayError

        ready, _ = ray.wait([probe], timeout=wait_s)
        if not ready:
            return False, None
        try:
            return True, ray.get(probe)
        except RayActorError:
            return True, "its Ray actor has died"
        except RayError:  # a liveness task that could not run (its node gone): no verdict of its own
            return True, None

    def last_look(self, wait_s: float = 5.0) -> Optional[str]:
        """After the run failed some other way: is a dead engine behind it? One probe per server, each answer
        awaited up to ``wait_s`` (no answer is no verdict here)."""
        import ray

        if self.failure is not None or not ray.is_initialized():
            return self.failure
        try:
            names = sorted(name for name in ray.util.list_named_actors() if SERVER_NAME.match(name))
        except Exception:
            return None
        return self.judge_last(names, wait_s)

    def judge_last(self, names: list[str], wait_s: float) -> Optional[str]:
        """``last_look`` on the servers listed now: one the watch saw before and Ray no longer lists has died (a
        dead actor's name is released: the rehearsal's own ``hf`` server, killed, fails the generation before the
        next look); else the first whose engine processes are gone, or that answers a probe with a failure."""
        for name in sorted(self._seen - set(names)):
            return failure_message(name, "its Ray actor has died")
        for name in names:
            check = self._send_process_check(*self._engines[name]) if name in self._engines else None
            answered, gone = self._read(check, wait_s) if check is not None else (False, None)
            if answered and processes_state(gone) is not None:
                return failure_message(name, DEAD_ENGINE)
            probe = self._send(name)
            answered, report = self._read(probe, wait_s) if probe is not None else (False, None)
            state = report[0] if isinstance(report, tuple) else report
            if answered and state is not None:
                return failure_message(name, state)
        return None


def failure_message(name: str, state: str) -> str:
    engine = SERVER_NAME.match(name).group(1)
    return (f"the rollout engine {name} ({engine}) stopped the run: {state}; see its log ({ray_logs()}, the "
            f"worker-*.err of the {name} actor and of its engine process)")


def ray_logs() -> str:
    """The logs folder of the Ray session this driver is in (a cluster of its own has its own temp dir)."""
    try:
        import ray

        return ray._private.worker._global_node.get_logs_dir_path()
    except Exception:  # a private API: Ray's default place if it moved
        return "/tmp/ray/session_latest/logs"


# Seconds. Below 0.1 s the watch would ask the servers without pause; past a day a wait is no watch (and from about
# 9.3e9 s Python's waits overflow: the watch's thread died and the run went on unwatched).
INTERVAL_BOUNDS = (0.1, 3600.0)
TIMEOUT_BOUNDS = (1.0, 86400.0)


def checked_settings(interval_s: Any, timeout_s: Any) -> tuple[float, float]:
    interval = check_number("rollout_watch.interval_s", interval_s, RecipeConfigError, low=INTERVAL_BOUNDS[0],
                            high=INTERVAL_BOUNDS[1])
    timeout = check_number("rollout_watch.timeout_s", timeout_s, RecipeConfigError, low=TIMEOUT_BOUNDS[0],
                           high=TIMEOUT_BOUNDS[1])
    return float(interval), float(timeout)
