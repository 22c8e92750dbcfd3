"""Plain ``python -m verl.trainer.main_ppo`` with README's overrides trains with APO and saves the anchor."""

from __future__ import annotations

import math
import shlex
import sys

import pytest
from helpers.rehearsal_runs import README, checkpoint_root, run, state, tail

from recipe_apo.cpu import rehearse


# ---- plain verl, as README's plain-verl section gives it -----------------------------------------------------------
def readme_plain_verl_overrides() -> list[str]:
    """README's plain-verl command, without what the rehearsal replaces (rollout engine, model, data files)."""
    text = README.read_text()
    start = text.index("python -m verl.trainer.main_ppo \\")
    block = text[start:text.index("```", start)].replace("\\\n", " ")
    replaced = ("actor_rollout_ref.rollout.name=", "actor_rollout_ref.model.path=", "data.")
    return [arg for arg in shlex.split(block)[3:] if not arg.startswith(replaced)]


@pytest.fixture(scope="module")
def plain_verl(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("plain")
    command = [
        sys.executable, "-m", "verl.trainer.main_ppo", "hydra.searchpath=[pkg://recipe_apo.conf]", "+rehearsal=cpu",
        *readme_plain_verl_overrides(), *rehearse.tiny_overrides(tiny), *rehearse.RUN_OVERRIDES,
        "actor_rollout_ref.rollout.name=hf", "trainer.experiment_name=plain", "trainer.total_training_steps=1",
        "trainer.save_freq=1", "trainer.val_before_train=false",
    ]
    result = run(command, workdir, "plain", workdir / "metrics",
                 env_extra={"VERL_USE_EXTERNAL_MODULES": "recipe_apo.cpu.activate"})
    return workdir, result


def test_readme_plain_verl_command_is_apo(tiny):
    overrides = readme_plain_verl_overrides()
    assert "algorithm.adv_estimator=apo" in overrides
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=apo" in overrides
    assert "trainer.checkpoint_callback_class=recipe_apo.integration.checkpoint.AnchorCheckpointCallback" in overrides


def test_plain_verl_trains_with_apo_and_saves_the_anchor(plain_verl):
    workdir, result = plain_verl
    assert result.returncode == 0, tail(result)
    saved = state(checkpoint_root(workdir, "plain") / "global_step_1")
    assert list(saved["anchors"]) == ["global"] and saved["anchors"]["global"]["steps"] == 1
    (row,) = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", "plain"))
    assert 0.0 < row["actor/apo_gate_weight"] <= 1.0  # the apo loss ran in verl's worker
    assert math.isfinite(row["critic/advantages/max"])
