"""Several nodes in the CPU rehearsal: the check that wants a cluster for them, what the driver changes to join
one, and how the local cluster's nodes are started; nothing here starts Ray (the whole run with two nodes:
tests/vllm/test_two_nodes.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers.composing import compose_recipe

from recipe_apo.cpu import local_cluster
from recipe_apo.cpu.checks import check_rehearsal_config
from recipe_apo.cpu.local_cluster import LocalCluster, for_existing_cluster
from recipe_apo.integration.errors import RecipeConfigError

CLUSTER = LocalCluster("127.0.0.1:6390", nodes=2, gpus_per_node=1, temp_dir="/tmp/ray-apo-x")


def rehearsal_config(*overrides):
    return compose_recipe("method=apo", "rehearsal=cpu", "actor_rollout_ref.rollout.n=2", *overrides)


@pytest.fixture
def auth_calls(monkeypatch):
    """Records the driver's switch to token authentication instead of flipping it in the test process."""
    from ray._private.authentication import authentication_token_setup

    calls = []
    monkeypatch.setattr(authentication_token_setup, "maybe_enable_token_auth_if_token_available",
                        lambda **kwargs: calls.append(kwargs))
    return calls


# ---- the check -----------------------------------------------------------------------------------------------------
def test_several_nodes_are_accepted_on_a_cluster_named_by_its_address():
    check_rehearsal_config(rehearsal_config(*CLUSTER.overrides()))
    # The cluster's nodes declare the GPUs: ray_init.num_gpus, which the driver drops, is not compared.
    check_rehearsal_config(rehearsal_config("trainer.nnodes=2", "trainer.n_gpus_per_node=4",
                                            "+ray_kwargs.ray_init.address=127.0.0.1:6390"))


def test_several_nodes_without_a_cluster_say_how_to_start_one():
    with pytest.raises(RecipeConfigError) as error:
        check_rehearsal_config(rehearsal_config("trainer.nnodes=3", "trainer.n_gpus_per_node=2"))
    message = str(error.value)
    assert message.startswith("trainer.nnodes=3: ") and "\n" not in message
    assert "python -m recipe_apo.cpu.local_cluster start --nodes 3 --gpus-per-node 2" in message


def test_no_node_is_refused():
    with pytest.raises(RecipeConfigError, match=r"^trainer\.nnodes=0: "):
        check_rehearsal_config(rehearsal_config("trainer.nnodes=0"))


# ---- what the driver changes to join a cluster ------------------------------------------------------------------
def test_joining_a_cluster_drops_what_only_a_new_one_takes_and_forwards_the_runs_environment(monkeypatch, auth_calls):
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", "/runs/metrics")
    monkeypatch.setenv("RECIPE_APO_REWARD_TIMEOUT", "9")
    monkeypatch.setenv("RECIPE_APO_HF_SECONDS_PER_TOKEN", "0.5")
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    config = rehearsal_config(*CLUSTER.overrides(),
                              "+ray_kwargs.ray_init.runtime_env.env_vars.RECIPE_APO_REWARD_TIMEOUT='5'")
    for_existing_cluster(config)
    ray_init = config.ray_kwargs.ray_init
    assert ray_init.address == CLUSTER.address
    assert not {"num_cpus", "num_gpus", "include_dashboard"} & set(ray_init)
    env = ray_init.runtime_env.env_vars
    assert env["VERL_FILE_LOGGER_ROOT"] == "/runs/metrics" and env["RECIPE_APO_HF_SECONDS_PER_TOKEN"] == "0.5"
    assert env["RECIPE_APO_REWARD_TIMEOUT"] == "5"  # the config's own value wins
    assert env["VERL_USE_EXTERNAL_MODULES"] == "recipe_apo.cpu.activate" and "SOMETHING_ELSE" not in env
    assert auth_calls == [{"warn_if_disabled": False}]


def test_a_new_cluster_keeps_its_settings(auth_calls):
    config = rehearsal_config()
    before = dict(config.ray_kwargs.ray_init)
    for_existing_cluster(config)
    assert dict(config.ray_kwargs.ray_init) == before and before["num_cpus"] == 16
    assert auth_calls == []


# ---- the local cluster's nodes -----------------------------------------------------------------------------------
def test_the_nodes_run_this_environments_ray_with_their_gpus_and_no_fixed_port():
    head = local_cluster._node_command(CLUSTER.address, True, 2, 8, "/tmp/ray-apo-x")
    other = local_cluster._node_command(CLUSTER.address, False, 2, 8, "/tmp/ray-apo-x")
    assert head[:3] == [str(Path(sys.executable).with_name("ray")), "start", "--block"]
    for command in (head, other):
        assert "--num-gpus=2" in command and "--temp-dir=/tmp/ray-apo-x" in command
        assert "--min-worker-port=0" in command and "--max-worker-port=0" in command
    assert "--head" in head and "--port=6390" in head and "--include-dashboard=false" in head
    assert f"--address={CLUSTER.address}" in other and "--include-log-monitor=false" in other
    ports = [flag for flag in head + other if "port=" in flag and not flag.endswith("port=0")]
    assert len({flag.split("=")[1] for flag in ports}) == len(ports)  # the head's --port, then free ones


def test_the_nodes_get_what_the_driver_gives_a_raylet_it_starts():
    from recipe_apo.cpu.activate import DRIVER_ENV

    assert local_cluster.NODE_ENV == DRIVER_ENV


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """The system's temp folder moved to ``tmp_path`` (the state file's folder and the clusters' temp dirs)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_command_says_what_it_cannot_do_in_one_line(own_tmp, capsys):
    record = local_cluster.state_file()
    assert record.parent.parent == own_tmp and str(os.getuid()) in record.parent.name
    assert local_cluster.main(["stop"]) == 1
    assert capsys.readouterr().err == f"local_cluster: error: no local cluster is recorded in {record}\n"
    assert local_cluster.main(["start", "--nodes", "0"]) == 1
    assert "--nodes=0 --gpus-per-node=1: both must be at least 1" in capsys.readouterr().err
    assert record.parent.stat().st_mode & 0o777 == 0o700  # made by start: this user's alone


def stop_with(record_text, capsys) -> str:
    state = local_cluster.state_file()
    state.parent.mkdir(mode=0o700, exist_ok=True)
    if isinstance(record_text, bytes):
        state.write_bytes(record_text)
    else:
        state.write_text(record_text)
    assert local_cluster.main(["stop"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"local_cluster: error: {state}: ")
    assert state.exists()  # the record stays for its owner to look at
    return err


def test_stop_acts_only_on_what_start_made(own_tmp, capsys):
    """A record that names a folder or processes start did not make (planted, or left by an older version, or an
    empty temp_dir that every command line contains) stops nothing and removes nothing."""
    import json
    import subprocess

    victim = own_tmp / "ray-apo-victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(victim)])
    try:
        base = {"address": "127.0.0.1:1", "nodes": 1, "gpus_per_node": 1, "pids": [bystander.pid], "token": "t"}
        for temp_dir in (str(victim), "", "/", str(own_tmp), "relative/ray-apo-x", "/etc/ray-apo-x"):
            assert "nothing was stopped or removed" in stop_with(json.dumps({**base, "temp_dir": temp_dir}), capsys)
        (victim / local_cluster.MARK).write_text("another token")
        assert "does not hold this cluster's mark" in stop_with(json.dumps({**base, "temp_dir": str(victim)}), capsys)
        for text in ("{", "[1, 2]", '{"temp_dir": "x"}', b"\xff\xfe", json.dumps({**base, "temp_dir": str(victim),
                                                                                 "pids": ["1"]})):
            stop_with(text, capsys)
        assert bystander.poll() is None and (victim / "precious").read_text() == "keep"
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_removes_its_own_marked_folder(own_tmp, capsys):
    import json

    folder = own_tmp / "ray-apo-mine"
    folder.mkdir()
    (folder / local_cluster.MARK).write_text("tok")
    state = local_cluster.state_file()
    state.parent.mkdir(mode=0o700)
    state.write_text(json.dumps({"address": "127.0.0.1:1", "nodes": 1, "gpus_per_node": 1, "pids": [],
                                 "token": "tok", "temp_dir": str(folder)}))
    assert local_cluster.main(["stop"]) == 0 and capsys.readouterr().out == "stopped\n"
    assert not folder.exists() and not state.exists()


def test_a_state_folder_others_can_write_is_refused(own_tmp, capsys):
    folder = local_cluster.state_file().parent
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    assert local_cluster.main(["stop"]) == 1
    assert "not a folder of this user's that no one else can write" in capsys.readouterr().err
