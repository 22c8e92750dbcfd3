"""method=apo through verl's sync trainer with verl's vLLM rollout: 2 steps with a checkpoint each, then the same
command resumes to step 3. A learning rate that moves the policy step by step (1e-2 on the tiny model), fp32: if
the new weights did not reach vLLM after an update, vLLM would sample from the old policy and its log-probs would
part from the actor's by as much as the policy moved."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.rehearsal_runs import SOURCES, dump, runtime_state, state, train_then_resume

from recipe_apo.methods.apo.anchor import AnchorBook
from recipe_apo.methods.apo.settings import ApoSettings

ARGS = ("actor_rollout_ref.actor.optim.lr=1e-2", "data.shuffle=false", "trainer.save_freq=1",
        "trainer.val_before_train=false")
# vLLM's log-probs against the actor's recomputation of the same tokens, fp32 on both sides.
PROBS_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def sync_runs(tiny, tmp_path_factory):
    return train_then_resume(tiny, tmp_path_factory.mktemp("vllm-sync"), ARGS, steps=2, engine="vllm")


def test_the_run_generated_with_vllm_and_resumed_at_step_3(sync_runs):
    assert [row["step"] for row in sync_runs["rows"]] == [1, 2, 3]
    log = sync_runs["log"].read_text()
    assert "rehearsal: cpu (rollout vllm)" in log and "vLLMHttpServer" in log


def test_vllms_log_probs_are_the_actors_at_every_step_while_the_policy_moves(sync_runs):
    rows, ckpt = sync_runs["rows"], sync_runs["ckpt"]
    for row in rows:
        assert row["training/rollout_probs_diff_max"] <= PROBS_TOLERANCE, row["step"]
    # Each update moved the weights visibly: the next step's rollouts came from a different policy.
    for step in (1, 2):
        before, after = (actor_weights(ckpt / f"global_step_{s}") for s in (step, step + 1))
        moved = max(float((after[name] - before[name]).abs().max()) for name in before)
        assert moved > 1e-3, (step, moved)


def actor_weights(folder) -> dict:
    saved = torch.load(folder / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    return {name: (t.to_local() if hasattr(t, "to_local") else t).float() for name, t in saved.items()}


def test_resume_continues_the_anchor_bit_for_bit(sync_runs):
    rows, ckpt = sync_runs["rows"], sync_runs["ckpt"]
    book, settings = AnchorBook(), ApoSettings()
    book.load_state_dict(runtime_state(ckpt / "global_step_2"))
    book.anchor().update(rows[2]["apo/batch_success"], settings.eta, settings.eta_min, settings.history)
    assert book.state_dict()["anchors"] == state(ckpt / "global_step_3")["anchors"]


def test_the_dumped_advantages_are_recomputed_from_the_dump(sync_runs):
    from recipe_apo.audit.analysis import audit_run
    from recipe_apo.audit.dumps import load_run
    from recipe_apo.methods import groups

    run_ = load_run(sync_runs["ckpt"])
    assert [step.step for step in run_.steps] == [1, 2, 3]
    logged = {row["step"]: row for row in sync_runs["rows"]}
    for step in run_.steps:
        assert len(step.scores) == 16 and set(step.data_sources) <= set(SOURCES)
        codes, n = groups.group_codes(step.groups)
        centered = step.scores - groups.group_rates(codes, n, step.scores)[codes]
        np.testing.assert_allclose(step.logged_advantages, step.logged_phi * centered, atol=1e-6)
        assert np.all(step.logged_anchor == logged[step.step]["apo/anchor"])
        assert len(dump(sync_runs["ckpt"] / "rollouts" / f"{step.step}.jsonl")) == 16
    # A fresh anchor replayed over the three steps gives the run's own advantages: the resume was exact.
    assert audit_run(run_, {})["logged"]["matches"] == ["APO"]
