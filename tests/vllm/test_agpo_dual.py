"""method=agpo_dual one step with verl's vLLM rollout, twice, as one Hydra multirun: with the default controller
and with temperature_gain=0 (every prompt at tau_base). vLLM's log-probs are those of the distribution it sampled
from (verl asks for processed log-probs), the actor's are at tau_base: they agree to float error when every prompt
is sampled at tau_base, and part when each prompt has its own temperature, which shows that the per-prompt
temperature reached vLLM's server request by request."""

from __future__ import annotations

import pytest
from helpers.rehearsal_runs import checkpoint_root, dump, run, tail

from recipe_apo.cpu import rehearse

GAINS = ("0.0", "0.15")


@pytest.fixture(scope="module")
def agpo_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm-agpo")
    command = rehearse.recipe_command(["agpo_dual"], tiny, "trainer.total_training_steps=1",
                                      "trainer.val_before_train=false", engine="vllm")
    command.insert(command.index("method=agpo_dual"), "-m")
    result = run([*command, f"algorithm.agpo_dual.temperature_gain={','.join(GAINS)}"], workdir, "agpo",
                 workdir / "metrics")
    assert result.returncode == 0, tail(result)
    names = rehearse.experiment_names(result.log)
    assert len(names) == len(GAINS)
    return {gain: {"row": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", name))[0],
                   "dump": dump(checkpoint_root(workdir, name) / "rollouts" / "1.jsonl")}
            for gain, name in zip(GAINS, names)}


def test_agpo_trains_a_step_on_vllms_samples_with_its_controllers(agpo_runs):
    for run_ in agpo_runs.values():
        row = run_["row"]
        assert row["step"] == 1 and row["agpo_dual/probe_tokens"] > 0 and row["agpo_dual/step_kl"] >= 0.0
        assert 0.05 <= row["agpo_dual/clip_eps_mean"] <= 0.4


def test_vllm_samples_each_prompt_at_its_own_temperature(agpo_runs):
    flat, tempered = agpo_runs["0.0"], agpo_runs["0.15"]
    assert {r["agpo_dual_temperature"] for r in flat["dump"]} == {1.0}
    assert flat["row"]["training/rollout_probs_diff_max"] <= 1e-4
    assert len({r["agpo_dual_temperature"] for r in tempered["dump"]}) > 1
    assert tempered["row"]["training/rollout_probs_diff_max"] > 1e-3
