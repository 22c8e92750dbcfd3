"""The adapters' side of the estimators' hand-offs (``recipe_apo.methods.handoff``): a runtime's estimator state kept
in the driver for its estimator, the inputs a runtime asks for handed while verl computes the advantages, and what
the estimators left handed back to the runtimes in the step's batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from recipe_apo.methods import catalog, driver_state, handoff
from recipe_apo.methods.apo.anchor import reset_driver_anchors
from recipe_apo.methods.apo.estimator import apo_outcome_advantage
from recipe_apo.methods.base import StepBatch, StepOutput, Trajectories


def step_batch(rewards, sources=None, trajectories=None, old_log_probs=None) -> StepBatch:
    rows = len(rewards)
    return StepBatch(uids=np.array([f"g{i // 4}" for i in range(rows)], dtype=object),
                     token_level_scores=torch.tensor(rewards, dtype=torch.float32).unsqueeze(1),
                     response_mask=torch.ones(rows, 1), trajectories=trajectories or Trajectories.single(rows),
                     old_log_probs=old_log_probs,
                     data_sources=None if sources is None else np.array(sources, dtype=object))


@pytest.fixture
def apo():
    """APO by data source from C_0 = 0.5, the anchor jumping to each step's y_t (eta_min = 1), Phi measured against
    the anchor before the step (``prior``)."""
    config = OmegaConf.create({"algorithm": {"adv_estimator": "apo", "apo": {
        "anchor_scope": "data_source", "anchor_init": 0.5, "eta_min": 1.0, "lambda_scale": 1.0,
        "anchor_order": "prior"}}})
    reset_driver_anchors()
    runtime = catalog.method("apo").build_runtime(config)
    handoff.keep_estimator_states([runtime])  # as an adapter starts a run
    yield runtime, config
    reset_driver_anchors()


def test_apos_estimator_moves_its_runtimes_anchors_by_the_handed_sources_and_the_runtime_gets_its_rows(apo):
    """Group g0 (math) scores 1, 0, 0, 0: p = 1/4 against C_0 = 1/2, Delta = -1/4, so the success's A = 3/4 is
    weighted by Phi = e^(1/4); group g1 (code) scores 1, 1, 0, 0: p = 1/2 = C_0, Phi = 1, A = +-1/2. Each source's
    anchor jumps to its y_t: math 1/4, code 1/2; every response was measured against 1/2."""
    runtime, config = apo
    runtime.begin_step(1)
    handoff.keep_estimator_states([runtime])
    batch = step_batch([1, 0, 0, 0, 1, 1, 0, 0], sources=["math"] * 4 + ["code"] * 4)
    with handoff.advantage_step([runtime], batch):
        assert driver_state.handed_scopes().tolist() == ["math"] * 4 + ["code"] * 4
        advantages, _ = apo_outcome_advantage(batch.token_level_scores, batch.response_mask, config=config.algorithm,
                                              index=batch.uids)
    assert driver_state.handed_scopes() is None  # handed for the advantage step only
    torch.testing.assert_close(advantages[:, 0], torch.tensor(
        [0.75 * math.exp(0.25)] + [-0.25 * math.exp(-0.25)] * 3 + [0.5, 0.5, -0.5, -0.5]))
    assert runtime.book.anchor("math").value == 0.25 and runtime.book.anchor("code").value == 0.5
    out = runtime.after_advantage(1, batch)
    assert out.dump["apo_anchor"].tolist() == [0.5] * 8
    assert out.dump["apo_phi"].tolist() == pytest.approx([math.exp(0.25)] + [math.exp(-0.25)] * 3 + [1.0] * 4)
    assert (out.metrics["apo/anchor/math"], out.metrics["apo/anchor/code"]) == (0.25, 0.5)

    # A step whose estimator does not run reads nothing of the step before.
    quiet = step_batch([1, 0, 0, 0], sources=["math"] * 4)
    with handoff.advantage_step([runtime], quiet):
        pass
    assert quiet.estimator_results == {} and runtime.after_advantage(2, quiet) == StepOutput()


def test_a_restored_book_is_the_one_the_estimator_reads_after_the_hand_off(apo):
    runtime, _ = apo
    before = runtime.book
    runtime.load_state_dict({"version": 1, "anchors": {"math": {"version": 1, "value": 0.5, "history": [0.5],
                                                                "history_len": 20, "steps": 1}}}, 3)
    assert runtime.book is not before and runtime.book.anchor("math").value == 0.5
    # The runtime's own book: the driver keeps the old one until an adapter hands the new one over.
    assert driver_state.kept("apo", lambda: None) is before
    handoff.keep_estimator_states([runtime])
    assert driver_state.kept("apo", lambda: None) is runtime.book


def test_codapo_gets_the_final_rows_old_log_probs_while_verl_computes_the_advantages():
    config = OmegaConf.create({"algorithm": {"adv_estimator": "codapo", "codapo": {"resample": False}}})
    runtime = catalog.method("codapo").build_runtime(config)
    old = torch.tensor([[-0.1], [-0.2], [-0.3]])
    # Three rows, two trajectories: rows 0 and 1 are one trajectory's outputs (1 its final), row 2 the other's.
    trajectories = Trajectories(final_rows=np.array([1, 2]), row_trajectory=np.array([0, 0, 1]))
    batch = step_batch([1, 1, 0], trajectories=trajectories, old_log_probs=old)
    with handoff.advantage_step([runtime], batch):
        assert torch.equal(driver_state.handed_log_probs(), old[1:])
    assert driver_state.handed_log_probs() is None


def test_a_runtime_without_estimator_state_drops_what_a_previous_run_kept():
    config = OmegaConf.create({"algorithm": {"adv_estimator": "r2po", "r2po": {"head_steps": 2, "policy_steps": 1}}})
    runtime = catalog.method("r2po").build_runtime(config)
    driver_state.keep("r2po", 1)  # a previous run's phase
    try:
        handoff.keep_estimator_states([runtime])
        assert driver_state.kept("r2po", lambda: None) is None
        runtime.begin_step(3)  # the policy phase of the first round
        handoff.keep_estimator_states([runtime])
        assert driver_state.kept("r2po", lambda: None) == 1
    finally:
        driver_state.forget("r2po")
