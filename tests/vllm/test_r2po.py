"""method=r2po through verl's whole loop on the CPU, on both rollout engines, with phases of one step
(``algorithm.r2po.head_steps=1 policy_steps=1``): the schedule logs phases 0, 1, 0 and a resume to step 4 goes on in
the policy phase; from the step checkpoints, a head step moves the rollout head alone and a policy step everything
but the head, and the optimizer's state restarts at each phase's first step; in head steps the rollout's log-probs
(pi_roll, sampled by the engine) agree with the actor's old log-probs within 1e-4, and in policy steps they do not
(the actor's are pi_base's). The model's head is drawn with std 0.05 rather than the source's 1e-6, so that
pi_roll and pi_base differ enough for the last check to mean something.

The hf engine's runs here rather than in tests/e2e for make test's time budget (two Ray sessions); make test-vllm
runs them."""

from __future__ import annotations

import pytest
import torch
from helpers.rehearsal_runs import checkpoint_root, run, tail
from safetensors.torch import load_file

from recipe_apo.cpu import rehearse
from recipe_apo.methods.r2po.model import add_rollout_head

ARGS = ("trainer.save_freq=1", "trainer.val_before_train=false", "algorithm.r2po.head_steps=1",
        "algorithm.r2po.policy_steps=1")
HEAD_STD = 0.05
AGREE = 1e-4  # the bound on |pi_roll(rollout) - pi_roll(actor)| in head steps


@pytest.fixture(scope="module")
def head_model(tiny, tmp_path_factory):
    target = tmp_path_factory.mktemp("r2po-model") / "model"
    add_rollout_head(tiny["model"], target, seed=3, std=HEAD_STD)
    return {**tiny, "model": target}


def _train(paths, workdir, engine, totals):
    results, rows = {}, {}
    for name, total in totals:
        results[name] = run(rehearse.recipe_command(["r2po"], paths, *ARGS, f"trainer.total_training_steps={total}",
                                                    engine=engine), workdir, name, workdir / "metrics" / name)
        assert results[name].returncode == 0, tail(results[name])
    (experiment,) = rehearse.experiment_names(results[totals[0][0]].log)
    for name in results:
        rows[name] = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / name, experiment))
    return {"rows": rows, "ckpt": checkpoint_root(workdir, experiment)}


@pytest.fixture(scope="module")
def hf_runs(head_model, tmp_path_factory):
    return _train(head_model, tmp_path_factory.mktemp("r2po-hf"), "hf", (("first", 3), ("second", 4)))


@pytest.fixture(scope="module")
def vllm_runs(head_model, tmp_path_factory):
    return _train(head_model, tmp_path_factory.mktemp("r2po-vllm"), "vllm", (("first", 3),))


def _weights(ckpt, step):
    state = torch.load(ckpt / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).float() for k, v in state.items()}


def _check_phases_and_agreement(rows):
    for row in rows:
        assert row["r2po/phase"] == (0.0 if row["step"] % 2 else 1.0), row["step"]
        diff = row["training/rollout_probs_diff_max"]
        if row["r2po/phase"] == 0.0:
            assert diff < AGREE, row["step"]           # both sample / score pi_roll
            assert "r2po/rarity_skipped_share" in row
        else:
            assert diff > 100 * AGREE, row["step"]     # the actor scores pi_base, the engine sampled pi_roll
            assert "r2po/range_skipped_share" in row


def test_hf_phases_resume_and_agreement(hf_runs):
    rows = hf_runs["rows"]
    assert [r["step"] for r in rows["first"]] == [1, 2, 3] and [r["step"] for r in rows["second"]] == [4]
    assert [r["r2po/round"] for r in rows["first"] + rows["second"]] == [0.0, 0.0, 1.0, 1.0]
    _check_phases_and_agreement(rows["first"] + rows["second"])  # step 4, after the resume: the policy phase


def test_each_phase_moves_its_own_parameters_and_restarts_adam(hf_runs, head_model):
    ckpt = hf_runs["ckpt"]
    before = {k: v.float() for k, v in load_file(head_model["model"] / "model.safetensors").items()}
    for step in (1, 2, 3, 4):
        after = _weights(ckpt, step)
        moved = {k for k in before if not torch.equal(after[k], before[k])}
        head = {k for k in before if k.startswith("rollout_head.")}
        if step % 2:  # head steps
            assert moved == head, step
        else:
            assert moved == set(before) - head, step  # every other weight has a gradient, and AdamW moves it
        before = after
        # Adam's state: only the phase's parameters, one step old (the optimizer restarted at the phase's start).
        optim = torch.load(ckpt / f"global_step_{step}" / "actor" / "optim_world_size_1_rank_0.pt",
                           weights_only=False)
        assert {float(s["step"]) for s in optim["state"].values()} == {1.0}, step
        assert (len(optim["state"]) == 2) == bool(step % 2), step  # the head's two matrices, or all the rest


def test_vllm_samples_from_the_rollout_head(vllm_runs):
    rows = vllm_runs["rows"]["first"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    _check_phases_and_agreement(rows)
