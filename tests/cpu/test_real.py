"""recipe_apo/cpu/real.py's own rules (make real): run names that survive a resume, the folder it owns, the step a
run reached. The whole loop on the real model: tests/vllm/test_real.py."""

import os
import re
import sys
import types

import pytest
from helpers.in_process import run_recipe_main

from recipe_apo.cpu import real


def _dry_run_in_process(command, capture_output, text, cwd, env):
    """``real.experiments``' dry run, ``python -m recipe_apo.main -m ... dry_run=true``, in this process with the
    environment it would have had (tests/helpers/in_process.py): the names are the entry's; a new interpreter would
    add 10 CPU-seconds of imports a run."""
    assert command[:3] == [sys.executable, "-m", "recipe_apo.main"] and capture_output and text, command
    with pytest.MonkeyPatch.context() as patch:
        for key in set(os.environ) - set(env):
            patch.delenv(key)
        for key, value in env.items():
            patch.setenv(key, value)
        return run_recipe_main(*command[3:], cwd=cwd)


@pytest.fixture(scope="module")
def names(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    data = {part: root / "data" / part for part in ("train", "val", "test")}
    model = root / "model"
    model.mkdir()
    out = root / "out"
    out.mkdir()

    def experiments(methods, seed):
        return real.experiments(methods, seed, model, data, out, 24, "hf")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(real, "subprocess", types.SimpleNamespace(run=_dry_run_in_process))
        return {"all": experiments(["apo", "grpo", "drgrpo"], 1), "one": experiments(["drgrpo"], 1)}


def test_a_run_keeps_its_name_whatever_else_the_sweep_holds(names):
    # A resumed study sweeps only its unfinished methods: their names, and so their checkpoints, must not move.
    assert names["one"]["drgrpo"] == names["all"]["drgrpo"]
    for method, name in names["all"].items():
        assert re.fullmatch(rf"smollm2-{method}-data\.seed=1-[0-9a-f]{{8}}", name), name
    assert len(set(names["all"].values())) == 3


def test_the_multirun_holds_the_studys_settings_and_the_seed(tmp_path):
    data = {part: tmp_path / part for part in ("train", "val", "test")}
    command = real.train_command(["apo", "grpo"], 3, tmp_path / "model", data, 24, "vllm")
    assert command[:6] == [sys.executable, "-m", "recipe_apo.main", "-m", "method=apo,grpo", "rehearsal=cpu"]
    for part in (*real.TRAINING, "data.seed=3", "trainer.total_training_steps=24", "trainer.save_freq=4",
                 "trainer.test_freq=4", "actor_rollout_ref.rollout.val_kwargs.n=2",
                 "actor_rollout_ref.rollout.name=vllm", "reward.custom_reward_function.path=pkg://recipe_apo.reward"):
        assert part in command, part
    # Every setting from the model to the data's batch size counts in the name's hash; only the seed is spelled out.
    count = int(next(p for p in command if p.startswith("run_name.script_overrides=")).split("=")[1])
    assert command[4 + count] == "data.seed=3"
    quick = real.train_command(["apo"], 1, tmp_path / "model", data, 10, "vllm", quick=True)
    assert "trainer.test_freq=10" in quick and "actor_rollout_ref.rollout.val_kwargs.n=4" in quick


def test_a_folder_the_study_did_not_write_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("x")
    with pytest.raises(real.StudyError, match="holds files that no study wrote"):
        real.check_out(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
    fresh = real.check_out(tmp_path / "new")
    assert (fresh / real.MARKER).is_file() and real.check_out(fresh) == fresh  # its own folder, again


def test_the_step_a_run_reached_is_verls_tracker(tmp_path):
    assert real.last_step(tmp_path, "run") == 0
    folder = real.checkpoint_dir(tmp_path, "run")
    folder.mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("20")
    assert real.last_step(tmp_path, "run") == 20


def test_the_audit_takes_the_earlier_sessions_runs_whose_checkpoints_are_still_here(tmp_path, monkeypatch):
    # Seed 1's apo and grpo were reported by an earlier session; apo's folder reached the last step, grpo's did not
    # (gone, or cut short); seed 2's apo is trained here.
    asked = []

    def experiments(methods, seed, model, data, out, steps, engine):
        asked.append((tuple(methods), seed))
        return {method: f"{method}-s{seed}" for method in methods}

    monkeypatch.setattr(real, "experiments", experiments)
    monkeypatch.setattr(real, "last_step", lambda out, name: {"apo-s1": 24, "grpo-s1": 8}.get(name, 0))
    earlier = {"runs": [{"method": "apo", "seed": 1}, {"method": "grpo", "seed": 1}, {"method": "apo", "seed": 2}]}
    audited = real.audited_runs({("apo", 2): "apo-s2"}, earlier, tmp_path, {}, tmp_path, 24, "hf")
    assert audited == {("apo", 2): "apo-s2", ("apo", 1): "apo-s1"}
    assert asked == [(("apo", "grpo"), 1)]  # the run trained here is not looked up again
