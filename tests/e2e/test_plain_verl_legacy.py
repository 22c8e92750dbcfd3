"""README's plain ``python -m verl.trainer.main_ppo`` command on verl 0.9.1's other trainer, ``trainer.use_v1=false``
(``main_ppo_v0``'s ``RayPPOTrainer``: the only one verl's ``neo`` branch keeps), with the rehearsal's ``hf``
rollout on the tiny model: APO's estimator runs in its driver and APO's loss in its actor, and its checkpoint
holds no anchor, since that trainer builds no ``trainer.checkpoint_callback_class`` (docs/plain_verl.md, "verl's
other trainer"). A verl whose legacy trainer learns to call the callback fails the last check: the docs then
change."""

from __future__ import annotations

import math

import pytest
from helpers.rehearsal_runs import STATE_FILE, checkpoint_root, run_readme_plain_verl, tail

from recipe_apo.cpu import rehearse

# What the rehearsal replaces in README's command: the model, the data and the rollout engine (vLLM's CPU build is
# in .venv-vllm only).
REPLACED = ("actor_rollout_ref.model.path=", "data.", "actor_rollout_ref.rollout.name=")


@pytest.fixture(scope="module")
def legacy_run(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("legacy")
    result = run_readme_plain_verl(tiny, workdir, "legacy", REPLACED, "trainer.use_v1=false")
    return workdir, result


def test_the_legacy_trainer_trains_with_apos_estimator_and_loss(legacy_run):
    workdir, result = legacy_run
    assert result.returncode == 0, tail(result)
    (row,) = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", "legacy"))
    assert 0.0 < row["actor/apo_gate_weight"] <= 1.0  # the apo loss ran in verl's worker
    assert math.isfinite(row["critic/advantages/max"])


def test_its_checkpoint_holds_no_anchor(legacy_run):
    workdir, result = legacy_run
    assert result.returncode == 0, tail(result)
    folder = checkpoint_root(workdir, "legacy") / "global_step_1"
    assert (folder / "actor").is_dir() and not (folder / STATE_FILE).exists()
