"""GRPO through verl's vLLM rollout for one step, then its engine dies: the step's samples, log-probs and
advantages are GRPO's, and the run ends in bounded time with one line naming the engine, not a hang.

verl 0.9.1 alone waits forever on a dead engine (its weight sender on the ZMQ reply, its replay buffer on samples
that never come); the recipe's driver watches the rollout servers (recipe_apo/integration/engine_watch.py). The
test kills vLLM's engine core process (``VLLM::EngineCore``, a child of the vLLMHttpServer actor) once step 1 is
done, in a run asked for 50 steps, and looks two seconds apart (``rollout_watch.interval_s=2``). One Ray session
for both checks: each costs about 100 s on 2 cores. Dr. GRPO and CoDaPO: tests/vllm/test_baselines.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid

import pytest
from helpers.rehearsal_runs import RUN_TIMEOUT_S, checkpoint_root, tail

from recipe_apo.cpu import rehearse

STEPS = 50
INTERVAL_S = 2
# From the kill to the run's exit: the watch's look, Ray's shutdown and the driver's exit. Measured: about 5 s.
BOUND_S = 60
MARKER = "RECIPE_APO_TEST_RUN"


def engine_core_pids(marker: str) -> list[int]:
    """This run's vLLM engine cores: another test's run may have its own on the machine at the same time. Every
    process of a run inherits the launching environment (Ray's raylet passes it to its workers), marker included."""
    found = subprocess.run(["pgrep", "-f", "VLLM::EngineCore"], capture_output=True, text=True).stdout
    mine = []
    for pid in map(int, found.split()):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"{MARKER}={marker}".encode() in environ:
            mine.append(pid)
    return mine


@pytest.fixture(scope="module")
def killed_run(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm-dead")
    marker, killed = uuid.uuid4().hex, {}

    def kill_after_step_1(line: str) -> None:
        if "step 1 done" in line and not killed:
            pids = engine_core_pids(marker)
            assert pids, "no vLLM engine core process of this run to kill"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed["at"] = time.perf_counter()

    command = rehearse.recipe_command(["grpo"], tiny, f"trainer.total_training_steps={STEPS}",
                                      "trainer.val_before_train=false", f"rollout_watch.interval_s={INTERVAL_S}",
                                      engine="vllm")
    env = {**rehearse.rehearsal_env(workdir / "metrics"), MARKER: marker}
    result = rehearse.run_logged(command, workdir / "dead.log", cwd=workdir, env=env, label="dead",
                                 say=kill_after_step_1, timeout=RUN_TIMEOUT_S)
    assert killed, "the run never finished step 1:\n" + tail(result)
    (experiment,) = rehearse.experiment_names(result.log)
    return {"result": result, "ended_after": time.perf_counter() - killed["at"],
            "rows": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", experiment)),
            "folder": checkpoint_root(workdir, experiment)}


def test_grpo_trains_a_step_on_vllms_samples(killed_run):
    from recipe_apo.audit.analysis import audit_run
    from recipe_apo.audit.dumps import load_run

    (row,) = killed_run["rows"]
    assert row["step"] == 1 and row["training/rollout_probs_diff_max"] <= 1e-4
    assert "actor/pg_clipfrac" in row and not any(key.startswith(("apo/", "codapo/")) for key in row)
    run_ = load_run(killed_run["folder"])
    assert [step.step for step in run_.steps] == [1] and len(run_.steps[0].scores) == 16
    assert "GRPO" in audit_run(run_)["logged"]["matches"]


def test_a_killed_engine_ends_the_run_with_one_line(killed_run):
    result = killed_run["result"]
    output = result.log.read_text().splitlines()
    errors = [line for line in output if line.startswith("recipe-apo: error:")]
    assert result.returncode == 1, output[-20:]
    assert killed_run["ended_after"] < BOUND_S, killed_run["ended_after"]
    assert errors == [output[-1]], errors
    assert errors[0].startswith("recipe-apo: error: the rollout engine vllm_server_0_0 (vllm) stopped the run: "
                                "its engine process has died; see its log")
