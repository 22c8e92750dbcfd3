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
    ("algorithm.use_kl_in_reward=true", "algorithm.use_kl_in_reward=true with algorithm.adv_estimator=r2po: a KL "
     "penalty makes every reward of a group distinct, so every rarity count is 1 and every head-phase advantage 0; "
     "R2PO's KL is the loss's (actor_rollout_ref.actor.use_kl_loss, as its source); set "
     "algorithm.use_kl_in_reward=false"),
    ("algorithm.norm_adv_by_std_in_grpo=false", "algorithm.norm_adv_by_std_in_grpo=false with algorithm.adv_estimator"
     "=r2po: R2PO's advantages divide by the group's std, as its source's do (it has no switch); set it to true"),
    ("actor_rollout_ref.model.lora_rank=abc", "actor_rollout_ref.model.lora_rank='abc' with algorithm.adv_estimator="
     "r2po: must be an integer, and 0: R2PO trains the whole model in its policy phase"),
    ("actor_rollout_ref.model.lora_rank=null", "actor_rollout_ref.model.lora_rank=null with algorithm.adv_estimator="
     "r2po: must be an integer, and 0"),
    ("actor_rollout_ref.model.lora_rank=2.0", "actor_rollout_ref.model.lora_rank=2.0 with algorithm.adv_estimator="
     "r2po: must be an integer, and 0"),
    ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_rank=8 with algorithm.adv_estimator=r2po: "
     "R2PO trains the whole model in its policy phase; set lora_rank=0"),
    ("actor_rollout_ref.model.lora.rank=x", "actor_rollout_ref.model.lora.rank='x' with algorithm.adv_estimator=r2po: "
     "must be an integer, and 0"),
    ("actor_rollout_ref.model.lora.rank=4", "actor_rollout_ref.model.lora.rank=4 with algorithm.adv_estimator=r2po: "
     "R2PO trains the whole model in its policy phase; set lora.rank=0"),
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


@pytest.mark.parametrize("config, expected", [
    ("[1, 2]", "config.json holds a JSON list, not a model config (a JSON object)"),
    ('{"architectures": ["Qwen2ForCausalLM"]}', "config.json names no model_type (got None); a model config names "
     "its family: llama, qwen2, qwen3"),
    ('{"model_type": "gpt2"}', "config.json: model_type 'gpt2' has no rollout-head class; families: llama, qwen2, "
     "qwen3"),
    ("{", "no readable config.json (JSONDecodeError: "),
])
def test_a_model_folder_whose_config_is_no_model_config_is_refused(config, expected, tmp_path):
    (tmp_path / "config.json").write_text(config)
    message = refusal(f"actor_rollout_ref.model.path={tmp_path}")
    assert message.startswith(f"actor_rollout_ref.model.path={tmp_path}: ") and expected in message, message


def test_a_copy_made_before_its_source_changed_is_refused_not_reused(tiny_task, tmp_path):
    import os

    from recipe_apo.main import prepare_models
    from recipe_apo.methods.r2po.model import MADE_FROM

    source = tmp_path / "model"
    shutil.copytree(tiny_task["model"], source)
    copy = tmp_path / "ckpt" / "r2po_model"

    def prepare():
        config = _config(f"actor_rollout_ref.model.path={source}", f"trainer.default_local_dir={tmp_path / 'ckpt'}")
        prepare_models(config)
        return config.actor_rollout_ref.model.path

    def refused(change):
        with pytest.raises(RecipeConfigError) as info:
            prepare()
        message = str(info.value)
        assert message == (f"actor_rollout_ref.model.path={source}: {copy} holds a rollout-head copy of {source} as "
                           f"it was before it changed ({change} since); remove the copy (and the checkpoints trained "
                           "from it), or give the run another checkpoint folder")

    assert prepare() == str(copy)
    made = json.loads((copy / MADE_FROM).read_text())
    assert made["files"]["model.safetensors"][0] == (source / "model.safetensors").stat().st_size
    stamp = (copy / "model.safetensors").stat().st_mtime_ns
    weights = (source / "model.safetensors").read_bytes()
    (source / "model.safetensors").write_bytes(weights)  # the same bytes written again (a download again) ...
    os.utime(source / "model.safetensors", ns=(made["files"]["model.safetensors"][1] + 10**9,) * 2)  # ... later
    refused("model.safetensors was rewritten")
    info = (source / "model.safetensors").stat()
    os.utime(source / "model.safetensors", ns=(info.st_atime_ns, made["files"]["model.safetensors"][1]))
    assert prepare() == str(copy)  # as it was: reused
    (source / "added.txt").write_text("x")
    refused("added.txt was added")
    (source / "added.txt").unlink()
    (source / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    refused("tokenizer.json was removed")
    (tmp_path / "tokenizer.json").rename(source / "tokenizer.json")
    # a record written before the files were (an earlier version's): checked by time
    (copy / MADE_FROM).write_text(json.dumps({"source": str(source), "seed": 0, "std": 0.02}) + "\n")
    assert prepare() == str(copy)
    os.utime(source / "config.json", ns=((copy / MADE_FROM).stat().st_mtime_ns + 10**9,) * 2)
    refused("config.json was rewritten")
    assert (copy / "model.safetensors").stat().st_mtime_ns == stamp  # never rebuilt or overwritten


def test_a_merged_checkpoint_under_the_plain_architecture_is_refused_not_given_a_fresh_head(head_model, tmp_path):
    from recipe_apo.main import prepare_models

    merged = tmp_path / "merged"
    shutil.copytree(head_model, merged)
    config = json.loads((merged / "config.json").read_text())
    (merged / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    run = _config(f"actor_rollout_ref.model.path={merged}", f"trainer.default_local_dir={tmp_path / 'ckpt'}")
    validate_recipe_config(run, rehearsal=False)
    with pytest.raises(RecipeConfigError) as info:
        prepare_models(run)
    assert str(info.value) == (
        f"actor_rollout_ref.model.path={merged}: {merged} holds a rollout head already (rollout_head.layer1.weight, "
        "... under architectures ['Qwen2ForCausalLM']: a merged R2PO checkpoint); to train it on, make its "
        "config.json's architectures R2POQwen2ForCausalLM; to start a fresh head, strip it first (python "
        "scripts/r2po_head.py strip)")
    assert not (tmp_path / "ckpt").exists()
