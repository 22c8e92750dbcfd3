"""The driver's watch on the rollout engines (recipe_apo/integration/engine_watch.py), without Ray: which actors it
watches, what a server answers, how a failure ends the run. A real engine killed in a real run:
tests/vllm/test_dead_engine.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from recipe_apo.integration import engine_watch
from recipe_apo.integration.engine_processes import processes_gone
from recipe_apo.integration.engine_watch import (
    DEAD_ENGINE,
    SERVER_NAME,
    EngineWatch,
    checked_settings,
    engine_report,
    engine_state,
    failure_message,
)
from recipe_apo.integration.errors import RecipeConfigError


@pytest.mark.parametrize("name, engine", [
    ("vllm_server_0_0", "vllm"), ("vllm_server_12_1", "vllm"), ("hf_server_0_0", "hf"),
    ("sglang_server_reward_0_0", "sglang"), ("vllm_server_teacher_1_0", "vllm"),
    ("vllm_server_0_0_suffix", "vllm"),
])
def test_verls_rollout_servers_are_watched(name, engine):
    assert SERVER_NAME.match(name).group(1) == engine


@pytest.mark.parametrize("name", ["GlobalRequestLoadBalancer", "vllm_server", "server_0_0", "WorkerDict_0"])
def test_other_actors_are_not(name):
    assert SERVER_NAME.match(name) is None


def test_a_server_says_its_engine_died_only_when_its_engine_says_so():
    assert engine_state(SimpleNamespace()) is None  # not started yet, or an engine without the flag
    assert engine_state(SimpleNamespace(engine=None)) is None
    assert engine_state(SimpleNamespace(engine=SimpleNamespace(errored=False))) is None
    assert engine_state(SimpleNamespace(engine=SimpleNamespace(errored=True))) == "its engine process has died"


def test_a_server_names_its_engine_processes():
    """vLLM's engine manager holds the engine core processes the server started; outside Ray no node is named."""
    def server(*pids, errored=False):
        manager = SimpleNamespace(processes=[SimpleNamespace(pid=pid) for pid in pids])
        return SimpleNamespace(engine=SimpleNamespace(
            errored=errored, engine_core=SimpleNamespace(resources=SimpleNamespace(engine_manager=manager))))

    assert engine_report(server(4242, 4243)) == (None, None, (4242, 4243))
    assert engine_report(server(4242, errored=True)) == (DEAD_ENGINE, None, (4242,))
    assert engine_report(server(None)) == (None, None, ())  # a process object not started yet
    assert engine_report(SimpleNamespace(engine=SimpleNamespace(errored=False))) == (None, None, ())  # elsewhere
    assert engine_report(SimpleNamespace()) == (None, None, ())


def test_a_killed_process_is_gone_before_and_after_its_parent_reaps_it():
    import os
    import signal
    import subprocess

    child = subprocess.Popen(["sleep", "60"])
    try:
        assert processes_gone((os.getpid(), child.pid)) == []
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not processes_gone((child.pid,)) and time.monotonic() < deadline:  # a zombie until reaped
            time.sleep(0.01)
        assert processes_gone((os.getpid(), child.pid)) == [child.pid]
    finally:
        child.kill()
        child.wait()
    assert processes_gone((child.pid, os.getpid())) == [child.pid]


class ScriptedWatch(EngineWatch):
    """Probes answered from a script instead of by Ray actors: (answered, report) per read, the server's probes and
    the engine processes' checks in the order the watch reads them."""

    def __init__(self, answers, timeout_s=30.0):
        super().__init__(1.0, timeout_s, interrupt=lambda: None)
        self.answers, self.sent = list(answers), []

    def _send(self, name):
        self.sent.append(name)
        return name

    def _send_process_check(self, node, pids):
        self.sent.append((node, pids))
        return node

    def _read(self, probe, wait_s=0.0):
        return self.answers.pop(0)


def test_a_starting_server_is_not_judged_on_time_and_a_silent_one_is_after_timeout_s():
    name = "vllm_server_0_0"
    watch = ScriptedWatch([(False, None), (True, None), (False, None), (False, None)])
    assert watch._look(name, 0.0) is None  # sends the first probe
    assert watch._look(name, 1000.0) is None  # vLLM still starting: unanswered, never answered before
    assert watch._look(name, 1001.0) is None  # answered: alive
    assert watch._look(name, 1002.0) is None  # the next probe goes out
    assert watch._look(name, 1031.0) is None  # 29 s unanswered
    assert watch._look(name, 1033.0) == "it has not answered for 30 s (rollout_watch.timeout_s)"
    assert watch.sent == [name, name]


def test_a_dead_engine_is_a_failure_at_the_look_that_reads_its_answer():
    watch = ScriptedWatch([(True, "its engine process has died")])
    assert watch._look("vllm_server_1_0", 0.0) is None
    assert watch._look("vllm_server_1_0", 5.0) == "its engine process has died"


def test_engine_processes_gone_are_a_failure_though_the_server_no_longer_answers():
    """A loaded machine can block a server's event loop for minutes, its probe unanswered: the processes its first
    answer named are looked at apart from it, on their node."""
    name, engine = "vllm_server_0_0", ("node-a", (4242,))
    watch = ScriptedWatch([(True, (None, *engine)),  # look 1: alive, and names its engine core
                           (True, []),  # look 2: the processes run
                           (False, None),  # look 3: the probe sent at look 2 unanswered
                           (False, None), (False, None),  # look 4: neither answered yet
                           (False, None), (True, [4242])])  # look 5: the engine core is gone
    assert watch._look(name, 0.0) is None  # the first probe goes out
    assert watch._look(name, 1.0) is None  # answered: its engine is known, a check of it goes out
    assert watch.sent == [name, engine]
    assert watch._look(name, 2.0) is None  # a new probe goes out; the check answers
    assert watch._look(name, 3.0) is None  # a new check goes out
    assert watch.sent == [name, engine, name, engine]
    assert watch._look(name, 4.0) is None
    assert watch._look(name, 5.0) == DEAD_ENGINE
    assert watch.answers == []


def test_a_server_that_names_no_engine_process_is_judged_by_its_answers_alone():
    watch = ScriptedWatch([(True, (None, "node-a", ())), (True, (None, "node-a", ()))])
    for now in (0.0, 1.0, 2.0, 3.0):
        assert watch._look("hf_server_0_0", now) is None
    assert watch.sent == ["hf_server_0_0", "hf_server_0_0"]


def test_a_look_that_fails_is_no_verdict_and_the_watch_goes_on():
    looks, interrupted = iter([RuntimeError("GCS busy"), None, "stopped: x"]), threading.Event()

    def check():
        answer = next(looks)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch = EngineWatch(0.01, 1.0, interrupt=interrupted.set)
    watch.check = check
    with watch:
        assert interrupted.wait(5)
    assert watch.failure == "stopped: x"


def test_an_interrupt_the_driver_does_not_act_on_is_sent_again(monkeypatch):
    monkeypatch.setattr(engine_watch, "RESEND_S", 0.01)
    interrupts = []
    watch = EngineWatch(0.01, 1.0, interrupt=lambda: interrupts.append(time.monotonic()))
    watch.check = lambda: "stopped: x"
    with watch:
        deadline = time.monotonic() + 5
        while len(interrupts) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(interrupts) >= 3 and not watch._thread.is_alive()


def test_the_first_failure_interrupts_the_driver_once_and_is_kept():
    interrupted = threading.Event()
    answers = iter([None, None, "the rollout engine vllm_server_0_0 (vllm) stopped the run: x"])
    watch = EngineWatch(0.01, 1.0, interrupt=interrupted.set)
    watch.check = lambda: next(answers)
    with watch:
        assert interrupted.wait(5)
    assert watch.failure == "the rollout engine vllm_server_0_0 (vllm) stopped the run: x"


def test_a_run_that_ends_stops_the_watch_without_a_failure():
    watch = EngineWatch(0.01, 1.0, interrupt=lambda: pytest.fail("interrupted"))
    watch.check = lambda: None
    with watch:
        pass
    assert watch.failure is None and not watch._thread.is_alive()


def test_outside_ray_there_is_nothing_to_watch(monkeypatch):
    import ray

    # Another test module of this process may hold a Ray session: the driver's view before ray.init, set here.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert EngineWatch(1, 1).check() is None and EngineWatch(1, 1).last_look() is None


def test_the_settings_default_to_5_and_120_seconds():
    watch = EngineWatch.from_config(OmegaConf.create({"trainer": {}}))
    assert (watch.interval_s, watch.timeout_s) == (5.0, 120.0)
    watch = EngineWatch.from_config(OmegaConf.create({"rollout_watch": {"interval_s": 0.5, "timeout_s": 30}}))
    assert (watch.interval_s, watch.timeout_s) == (0.5, 30.0)


@pytest.mark.parametrize("interval, timeout, message", [
    (0, 120, "rollout_watch.interval_s must be >= 0.1, got 0"),
    (1e-9, 120, "rollout_watch.interval_s must be >= 0.1, got 1e-09"),
    (5, -1, "rollout_watch.timeout_s must be >= 1.0, got -1"),
    (5, 9.3e9, "rollout_watch.timeout_s must be <= 86400.0, got 9300000000.0"),
    (1e10, 120, "rollout_watch.interval_s must be <= 3600.0, got 10000000000.0"),
    ("5", 120, "rollout_watch.interval_s must be a finite number, got '5'"),
    (5, float("inf"), "rollout_watch.timeout_s must be a finite number, got inf"),
])
def test_bad_settings_are_refused_naming_the_key(interval, timeout, message):
    with pytest.raises(RecipeConfigError) as error:
        checked_settings(interval, timeout)
    assert str(error.value) == message


def test_a_bad_setting_is_refused_at_launch():
    from helpers.composing import compose_recipe

    from recipe_apo.integration.validation import validate_recipe_config

    config = compose_recipe("method=apo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
                            "rollout_watch.timeout_s=0")
    with pytest.raises(RecipeConfigError, match=r"^rollout_watch.timeout_s must be >= 1.0, got 0$"):
        validate_recipe_config(config)
    typo = compose_recipe("method=apo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
                          "+rollout_watch.timeout=600")
    with pytest.raises(RecipeConfigError, match=r"^rollout_watch.timeout: not a setting of the engine watch; its "
                                                r"settings: interval_s, timeout_s$"):
        validate_recipe_config(typo)


def test_the_watchs_settings_do_not_name_the_run():
    """A run restarted with a longer timeout is the same run: it resumes its checkpoints."""
    from recipe_apo.integration.naming import experiment_name

    assert experiment_name("apo", ["rollout_watch.timeout_s=600", "rollout_watch.interval_s=1"]) == \
        experiment_name("apo", [])


def test_the_driver_says_the_dead_engine_in_one_line_and_exits_1(capsys, monkeypatch):
    """The watch interrupts the driver's wait on the task runner (a KeyboardInterrupt in the main thread)."""
    import verl.trainer.main_ppo as main_ppo

    from recipe_apo import main as recipe_main
    from recipe_apo.integration import engine_watch

    class FailedWatch(EngineWatch):
        def __enter__(self):
            self.failure = "the rollout engine vllm_server_1_0 (vllm) stopped the run: its engine process has died"
            return self

    def interrupted_run_ppo(config, task_runner_class):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_watch.EngineWatch, "from_config", classmethod(lambda cls, config: FailedWatch(1, 1)))
    monkeypatch.setattr(main_ppo, "run_ppo", interrupted_run_ppo)
    monkeypatch.setattr("verl.utils.config.validate_config", lambda **kwargs: None)
    monkeypatch.setattr("verl.utils.device.auto_set_device", lambda config: None)
    monkeypatch.setattr("verl.trainer.ppo.utils.need_reference_policy", lambda config: False)
    monkeypatch.setattr("verl.trainer.ppo.utils.need_critic", lambda config: False)
    with pytest.raises(SystemExit) as exit_info:
        recipe_main.run(OmegaConf.create({"trainer": {"device": "cpu"}}))
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "recipe-apo: error: the rollout engine vllm_server_1_0 (vllm) stopped the run: its engine process has died"]


def test_a_users_ctrl_c_is_still_a_ctrl_c(monkeypatch):
    import verl.trainer.main_ppo as main_ppo

    from recipe_apo import main as recipe_main

    def interrupted_run_ppo(config, task_runner_class):
        raise KeyboardInterrupt

    monkeypatch.setattr(main_ppo, "run_ppo", interrupted_run_ppo)
    monkeypatch.setattr("verl.utils.config.validate_config", lambda **kwargs: None)
    monkeypatch.setattr("verl.utils.device.auto_set_device", lambda config: None)
    monkeypatch.setattr("verl.trainer.ppo.utils.need_reference_policy", lambda config: False)
    monkeypatch.setattr("verl.trainer.ppo.utils.need_critic", lambda config: False)
    with pytest.raises(KeyboardInterrupt):
        recipe_main.run(OmegaConf.create({"trainer": {"device": "cpu"}}))


def test_the_interrupt_ends_a_blocking_wait_of_the_main_thread():
    """The watch's interrupt reaches a main thread blocked in a system call (here a read on a pipe nobody writes),
    which ``_thread.interrupt_main`` alone leaves blocked until the call returns."""
    import os
    import signal

    from recipe_apo.integration.engine_watch import interrupt_main_thread

    # Python's own SIGINT handler, as a driver has it: a library an earlier test of this process imported (the
    # suite runs many in one worker) may have installed another, which raises nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    read_end, write_end = os.pipe()
    timer = threading.Timer(0.5, interrupt_main_thread)
    rescue = threading.Timer(30.0, os.write, (write_end, b"x"))  # without the interrupt the read returns, and fails
    timer.start()
    rescue.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            os.read(read_end, 1)
    finally:
        timer.cancel()
        rescue.cancel()
        os.close(read_end)
        os.close(write_end)
        signal.signal(signal.SIGINT, previous)


def test_the_rehearsal_waits_longer_for_a_silent_engine_and_the_command_line_still_decides():
    """On a loaded 2-core machine a healthy CPU engine went silent past 120 s: the rehearsal waits 600 s."""
    from helpers.composing import compose_recipe

    assert compose_recipe("method=apo", "rehearsal=cpu").rollout_watch.timeout_s == 600
    assert compose_recipe("method=apo", "rehearsal=cpu", "rollout_watch.timeout_s=30").rollout_watch.timeout_s == 30
    assert compose_recipe("method=apo", "actor_rollout_ref.rollout.name=vllm").rollout_watch.timeout_s == 120


def test_after_a_failure_a_server_seen_before_and_no_longer_listed_is_named():
    """The rehearsal's own hf server, killed, fails the generation within seconds, before the watch's next look:
    Ray has released its name by then. The watch saw it at an earlier look, so its last look names it."""
    watch = ScriptedWatch([(True, None), (True, None)])
    watch._seen.update(["hf_server_0_0", "hf_server_1_0"])
    assert watch.judge_last(["hf_server_1_0"], 0.0) == failure_message("hf_server_0_0", "its Ray actor has died")
    assert watch.judge_last(["hf_server_0_0", "hf_server_1_0"], 0.0) is None  # both alive and well
    assert "the rollout engine hf_server_0_0 (hf) stopped the run: its Ray actor has died" in failure_message(
        "hf_server_0_0", "its Ray actor has died")


def test_after_a_failure_a_server_whose_engine_processes_are_gone_is_named():
    """The last look asks the engine processes first: a server that does not answer its probe is still named."""
    watch = ScriptedWatch([(True, [4242]), (True, []), (False, None)])
    watch._engines.update({"vllm_server_0_0": ("node-a", (4242,)), "vllm_server_1_0": ("node-a", (4343,))})
    assert watch.judge_last(["vllm_server_0_0"], 0.0) == failure_message("vllm_server_0_0", DEAD_ENGINE)
    assert watch.judge_last(["vllm_server_1_0"], 0.0) is None  # its engine runs; its probe unanswered: no verdict
    assert watch.answers == []
