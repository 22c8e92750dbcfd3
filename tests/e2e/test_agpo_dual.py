"""method=agpo_dual through verl's whole loop on the CPU (the ``hf`` rollout): a step with every prompt at tau_base
(``temperature_gain=0``: the control), checkpointed, then a resume for two more at the preset's temperatures, each
checkpointed. The probe, the per-prompt temperature, the per-prompt clip in the loss and the controllers' state
across the resume; one Ray session less than a control run of its own."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from helpers.rehearsal_runs import dump, train_then_resume

from recipe_apo.methods.agpo_dual.settings import AgpoSettings

STATE_FILE = "agpo_state.json"  # AGPO's state file (recipe_apo.methods.agpo_dual's declaration)

pytestmark = pytest.mark.e2e
ARGS = ("trainer.save_freq=1", "trainer.val_before_train=false", "trainer.experiment_name=agpo")
# The first run: one step with every prompt sampled at tau_base (the rollout's log-probs then are the actor's).
FLAT = ("algorithm.agpo.temperature_gain=0.0",)


@pytest.fixture(scope="module")
def agpo_runs(tiny, tmp_path_factory):
    runs = train_then_resume(tiny, tmp_path_factory.mktemp("agpo"), ARGS, steps=1, method="agpo_dual",
                             first_only=FLAT, resumed_steps=2)
    runs["states"] = {s: json.loads((runs["ckpt"] / f"global_step_{s}" / STATE_FILE).read_text()) for s in (1, 2, 3)}
    runs["dumps"] = {s: dump(runs["ckpt"] / "rollouts" / f"{s}.jsonl") for s in (1, 2, 3)}
    return runs


def by_prompt(rows):
    groups = defaultdict(list)
    for row in rows:
        groups[row["uid"].rsplit("_", 2)[0]].append(row)
    return groups


def test_every_checkpoint_holds_the_controllers_as_that_step_logged_them(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    assert sorted(rows) == [1, 2, 3]
    for step, state in agpo_runs["states"].items():
        assert state["kind"] == "agpo_dual" and state["global_step"] == step
        logged = rows[step]
        assert (state["uncertainty_avg"], state["entropy_ref"], state["kl_avg"]) == (
            logged["agpo_dual/uncertainty_avg"], logged["agpo_dual/entropy_ref"], logged["agpo_dual/kl_avg"])


def test_the_resume_moves_kl_bar_on_from_exactly_the_saved_state(agpo_runs):
    rate = AgpoSettings().average_rate
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    kl = 0.0
    for step in (1, 2, 3):  # steps 2 and 3 ran in the resumed process, from global_step_1's file
        kl = rate * rows[step]["agpo_dual/step_kl"] + (1.0 - rate) * kl
        assert rows[step]["agpo_dual/kl_avg"] == kl
    assert rows[1]["agpo_dual/step_kl"] > 0.0


def test_each_prompt_is_sampled_at_its_temperature_and_clipped_at_its_eps(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    for step, responses in agpo_runs["dumps"].items():
        groups = by_prompt(responses)
        assert len(groups) == 4 and all(len(g) == 4 for g in groups.values())
        tau = np.array([g[0]["agpo_temperature"] for g in groups.values()])
        eps = np.array([g[0]["agpo_clip_eps"] for g in groups.values()])
        for g in groups.values():  # one value per prompt
            assert {r["agpo_temperature"] for r in g} == {g[0]["agpo_temperature"]}
            assert {r["agpo_clip_eps"] for r in g} == {g[0]["agpo_clip_eps"]}
        assert ((tau >= 0.5) & (tau <= 1.5)).all() and ((eps >= 0.05) & (eps <= 0.4)).all()
        assert rows[step]["agpo_dual/temperature_mean"] == pytest.approx(tau.mean(), rel=1e-6)
        assert rows[step]["agpo_dual/clip_eps_mean"] == pytest.approx(eps.mean(), rel=1e-6)
        # the loss saw the same clips: its token-weighted mean lies within the prompts' range
        assert eps.min() - 1e-6 <= rows[step]["actor/agpo_clip_eps_mean"] <= eps.max() + 1e-6
        assert rows[step]["agpo_dual/probe_tokens"] >= 4 * AgpoSettings().probe_samples  # a token at least each
    # the run's first prompt is the controller's start: c = 0, tau = tau_base (verl's dump sorts prompts by uid)
    assert 1.0 in {g[0]["agpo_temperature"] for g in by_prompt(agpo_runs["dumps"][1]).values()}


def test_the_kl_penalty_runs_against_the_reference_model(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    assert rows[1]["actor/kl_coef"] == 0.03 and all("actor/kl_loss" in rows[s] for s in (1, 2, 3))


def test_the_rollout_samples_at_each_prompts_temperature(agpo_runs):
    """The rollout's log-probs are of the distribution it sampled from (softmax(logits / tau)), the actor's at
    tau_base: they agree to float error when every prompt is sampled at tau_base (step 1, temperature_gain=0), and
    part when the prompts' temperatures differ from it, as they do by default (steps 2 and 3)."""
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    assert {r["agpo_temperature"] for r in agpo_runs["dumps"][1]} == {1.0}
    assert rows[1]["training/rollout_probs_diff_max"] <= 1e-4
    for step in (2, 3):
        assert {r["agpo_temperature"] for r in agpo_runs["dumps"][step]} != {1.0}
        assert rows[step]["training/rollout_probs_diff_max"] > 1e-3, step
