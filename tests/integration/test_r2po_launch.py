"""What the launch refuses of a method=r2po run, in one line naming the setting, before Ray starts: the model without
a rollout head, verl's rollout correction, asynchronous modes, other engines and kernels, bad algorithm.r2po.*."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.composing import compose_recipe
from helpers.in_process import run_recipe_main
from omegaconf import open_dict

from recipe_apo.integration.modes import recipe_mode
from recipe_apo.integration.validation import RecipeConfigError, validate_recipe_config


@pytest.fixture(scope="module")
def head_model(tiny_task, tmp_path_factory):
    from recipe_apo.methods.r2po.model import add_rollout_head

    return add_rollout_head(tiny_task["model"], tmp_path_factory.mktemp("r2po-launch") / "model")


def _config(*overrides: str):
    config = compose_recipe("method=r2po", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4",
                            *overrides, resolve=False)
    with open_dict(config):
        config.trainer.v1.trainer_mode = recipe_mode(config.trainer.v1.get("trainer_mode", "sync"))
    return config


def refusal(*overrides: str) -> str:
    with pytest.raises(RecipeConfigError) as info:
        validate_recipe_config(_config(*overrides), rehearsal=False)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_the_preset_with_a_head_model_passes(head_model):
    validate_recipe_config(_config(f"actor_rollout_ref.model.path={head_model}"), rehearsal=False)


def test_a_model_that_is_no_local_folder_is_refused_with_what_to_do():
    message = refusal("actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B")
    assert message == ("actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B with algorithm.adv_estimator=r2po: R2PO "
                       "trains a rollout head beside the policy, added to a local copy of the model; download the "
                       "model and give its folder, or make the copy yourself: python scripts/r2po_head.py add "
                       "<model folder> <folder>")


def test_a_plain_local_model_trains_as_a_copy_with_the_head_made_once(tiny_task, tmp_path, capsys):
    from recipe_apo.main import prepare_models

    def run(model, checkpoints="ckpt"):
        return _config(f"actor_rollout_ref.model.path={model}", f"trainer.default_local_dir={tmp_path / checkpoints}")

    config = run(tiny_task["model"])
    validate_recipe_config(config, rehearsal=False)  # a plain local model passes: the launch prepares it
    prepare_models(config)
    copy = tmp_path / "ckpt" / "r2po_model"
    assert config.actor_rollout_ref.model.path == str(copy)
    assert json.loads((copy / "config.json").read_text())["architectures"] == ["R2POQwen2ForCausalLM"]
    assert capsys.readouterr().out == (f"recipe-apo: R2PO trains {copy}, a copy of {tiny_task['model']} with what "
                                       "its model adds\n")
    stamp = (copy / "model.safetensors").stat().st_mtime_ns
    again = run(tiny_task["model"])
    prepare_models(again)  # a resume finds the copy and keeps it
    assert again.actor_rollout_ref.model.path == str(copy) and (copy / "model.safetensors").stat().st_mtime_ns == stamp
    head = run(copy, "other")
    prepare_models(head)  # a model with the head trains as it is
    assert head.actor_rollout_ref.model.path == str(copy) and not (tmp_path / "other").exists()
    other = tmp_path / "other-model"
    shutil.copytree(tiny_task["model"], other)
    with pytest.raises(RecipeConfigError, match=f"holds a rollout-head copy of {tiny_task['model']}, not of {other}"):
        prepare_models(run(other))


@pytest.mark.parametrize("override, expected", [
    ("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is=token with "
     "algorithm.adv_estimator=r2po: R2PO's policy phase learns pi_base on pi_roll's samples with no importance "
     "correction (as its source); set algorithm.rollout_correction.rollout_is=null"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs=token_k1 with"),
    ("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.bypass_mode=true with"),
    ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.trainer_mode=colocate_async with "
     "algorithm.adv_estimator=r2po: a rollout of an asynchronous mode spans weight updates"),
    ("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.name=sglang with algorithm.adv_estimator="
     "r2po: no rollout-head model for that engine; use one of vllm, hf"),
    ("actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.strategy=fsdp with algorithm.adv_estimator="
     "r2po: each phase trains part of the model, and only FSDP2 (per-parameter shards) leaves the idle part without "
     "gradients"),
    ("actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.model.use_fused_kernels=true with"),
    ("actor_rollout_ref.model.external_lib=null", "actor_rollout_ref.model.external_lib=None with "
     "algorithm.adv_estimator=r2po: verl must import recipe_apo.integration.model_classes"),
    ("algorithm.r2po.head_steps=0", "algorithm.r2po.head_steps must be an integer in [1, 1000000], got 0"),
    ("algorithm.r2po.policy_steps=[40,-1]", "algorithm.r2po.policy_steps[1] must be an integer in [1, 1000000], "
     "got -1"),
    ("+algorithm.r2po.head_stpes=3", "unknown setting algorithm.r2po.head_stpes"),
])
def test_each_refusal_names_its_setting(override, expected, head_model):
    assert expected in refusal(f"actor_rollout_ref.model.path={head_model}", override)


def test_a_dry_run_refuses_before_ray_starts(head_model, tmp_path):
    result = run_recipe_main("method=r2po", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4",
                             f"actor_rollout_ref.model.path={head_model}", "algorithm.r2po.policy_steps=[]",
                             "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "recipe-apo: error: algorithm.r2po.policy_steps must be an integer or a non-empty list of integers, got []"]
