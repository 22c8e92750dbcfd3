"""A watch on the run's rollout servers from the driver: a dead engine ends the run with one line, not a hang.

When a vLLM engine process dies mid-run, verl 0.9.1's weight sender (in the FSDP workers) waits forever for the
engine's ZMQ reply, and the run never ends; this happens on GPUs as on the CPU. verl has no setting that bounds
that wait, so the recipe watches from the driver: every ``rollout_watch.interval_s`` seconds it asks each of the
run's rollout server actors (verl names them ``<engine>_server_<replica>_<node>``) whether its engine is alive.
A server whose engine reports itself dead (vLLM's ``AsyncLLM.errored``), whose actor has died, or which has not
answered within ``rollout_watch.timeout_s`` ends the run: the watch interrupts the driver, which says one
``recipe-apo: error:`` line naming the server and where its log is, shuts Ray down (the hung workers with it)
and exits with status 1. So a dead engine ends the run within ``interval_s`` plus a probe, an unresponsive one
within ``interval_s + timeout_s`` (two minutes and five seconds by default).
"""

from __future__ import annotations

import _thread
import re
import signal
import threading
from typing import Any, Callable, Optional

from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.methods.checks import check_number

# verl's rollout servers (vLLM's, SGLang's, the rehearsal's hf one): <engine>_server_[reward_|teacher_]<rank>_<node>.
SERVER_NAME = re.compile(r"^([A-Za-z0-9]+)_server_(?:reward_|teacher_)?\d+_\d+")


class EngineDeadError(RuntimeError):
    """A rollout engine of the run is dead or has stopped answering; the message names it."""


def engine_state(server: Any) -> Optional[str]:
    """Run inside a server actor: what is wrong with its engine, or None. vLLM's engine client says ``errored``
    once its engine core process has died; a server whose engine has not started yet has none to ask."""
    engine = getattr(server, "engine", None)
    if engine is not None and bool(getattr(engine, "errored", False)):
        return "its engine process has died"
    return None


class EngineWatch:
    """``with EngineWatch(interval_s, timeout_s): run_ppo(...)``; after an interruption, ``failure`` says why."""

    def __init__(self, interval_s: float, timeout_s: float, interrupt: Callable[[], None] = None):
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.failure: Optional[str] = None
        self._interrupt = interrupt or (lambda: _thread.interrupt_main(signal.SIGINT))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="recipe-apo-engine-watch", daemon=True)

    @classmethod
    def from_config(cls, config: Any) -> "EngineWatch":
        settings = config.get("rollout_watch") or {}
        return cls(*checked_settings(settings.get("interval_s", 5), settings.get("timeout_s", 120)))

    def __enter__(self) -> "EngineWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + self.interval_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            failure = self.check()
            if failure and not self._stop.is_set():
                self.failure = failure
                self._interrupt()
                return

    def check(self) -> Optional[str]:
        """One look at every rollout server of this Ray job: the first failure's message, or None."""
        import ray

        if not ray.is_initialized():
            return None
        try:
            names = sorted(name for name in ray.util.list_named_actors() if SERVER_NAME.match(name))
        except Exception:  # Ray shutting down: nothing left to watch
            return None
        for name in names:
            failure = self._probe(name)
            if failure:
                return failure
        return None

    def _probe(self, name: str) -> Optional[str]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        engine = SERVER_NAME.match(name).group(1)
        try:
            server = ray.get_actor(name)
            state = ray.get(server.__ray_call__.remote(engine_state), timeout=self.timeout_s)
        except ValueError:
            return None  # gone between the listing and the lookup: the run is tearing it down
        except GetTimeoutError:
            state = f"it has not answered for {self.timeout_s:g} s (rollout_watch.timeout_s)"
        except RayActorError:
            state = "its Ray actor has died"
        if state is None:
            return None
        return (f"the rollout engine {name} ({engine}) stopped the run: {state}; see its log (Ray's session "
                f"folder, /tmp/ray/session_latest/logs/, the worker-*.err of the {name} actor and of its engine "
                f"process)")


def checked_settings(interval_s: Any, timeout_s: Any) -> tuple[float, float]:
    interval = check_number("rollout_watch.interval_s", interval_s, RecipeConfigError, low=0, low_open=True)
    timeout = check_number("rollout_watch.timeout_s", timeout_s, RecipeConfigError, low=0, low_open=True)
    return float(interval), float(timeout)
