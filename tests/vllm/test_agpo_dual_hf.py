"""method=agpo_dual through verl's whole loop on the CPU (the ``hf`` rollout): two steps in one Ray session, each
checkpointed (here rather than in tests/e2e for make test's time budget; the hf rollout needs no vLLM). The
probe, the per-prompt temperature, the per-prompt clip in the loss and the controllers' state in every checkpoint.

What this file leaves to others, each a Ray session (about 60 CPU-seconds on 2 cores) it does not start: the resume
is one code path for every method's runtime (``integration/checkpoint.py``), run in the real loop by APO's
(tests/e2e/test_apo_resume.py), with AGPO's controllers round-tripped bit for bit one level down
(tests/integration/test_state_files.py); the control at tau_base (the hf rollout's log-probs are the actor's) is
APO's run on the same rollout, and AGPO's own, a Hydra multirun with ``temperature_gain=0``, is in the vLLM suite
(tests/vllm/test_agpo_dual.py)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from helpers.rehearsal_runs import checkpoint_root, dump, run, tail

from recipe_apo.cpu import rehearse
from recipe_apo.methods.agpo_dual.settings import AgpoDualSettings

STATE_FILE = "agpo_dual_state.json"  # AGPO (dual)'s state file (recipe_apo.methods.agpo_dual's declaration)

pytestmark = pytest.mark.e2e
STEPS = (1, 2)
ARGS = ("trainer.save_freq=1", "trainer.val_before_train=false", f"trainer.total_training_steps={len(STEPS)}")


@pytest.fixture(scope="module")
def agpo_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("agpo")
    result = run(rehearse.recipe_command(["agpo_dual"], tiny, *ARGS), workdir, "agpo", workdir / "metrics")
    assert result.returncode == 0, tail(result)
    (experiment,) = rehearse.experiment_names(result.log)
    ckpt = checkpoint_root(workdir, experiment)
    return {"rows": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", experiment)),
            "states": {s: json.loads((ckpt / f"global_step_{s}" / STATE_FILE).read_text()) for s in STEPS},
            "dumps": {s: dump(ckpt / "rollouts" / f"{s}.jsonl") for s in STEPS}}


def by_prompt(rows):
    groups = defaultdict(list)
    for row in rows:
        groups[row["uid"].rsplit("_", 2)[0]].append(row)
    return groups


def test_every_checkpoint_holds_the_controllers_as_that_step_logged_them(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    assert sorted(rows) == list(STEPS)
    for step, state in agpo_runs["states"].items():
        assert state["kind"] == "agpo_dual" and state["global_step"] == step
        logged = rows[step]
        assert (state["uncertainty_avg"], state["entropy_ref"], state["kl_avg"]) == (
            logged["agpo_dual/uncertainty_avg"], logged["agpo_dual/entropy_ref"], logged["agpo_dual/kl_avg"])


def test_kl_bar_moves_once_a_step_by_the_steps_kl(agpo_runs):
    rate = AgpoDualSettings().average_rate
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    kl = 0.0
    for step in STEPS:
        kl = rate * rows[step]["agpo_dual/step_kl"] + (1.0 - rate) * kl
        assert rows[step]["agpo_dual/kl_avg"] == kl
    assert rows[1]["agpo_dual/step_kl"] > 0.0


def test_each_prompt_is_sampled_at_its_temperature_and_clipped_at_its_eps(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    for step, responses in agpo_runs["dumps"].items():
        groups = by_prompt(responses)
        assert len(groups) == 4 and all(len(g) == 4 for g in groups.values())
        tau = np.array([g[0]["agpo_dual_temperature"] for g in groups.values()])
        eps = np.array([g[0]["agpo_dual_clip_eps"] for g in groups.values()])
        for g in groups.values():  # one value per prompt
            assert {r["agpo_dual_temperature"] for r in g} == {g[0]["agpo_dual_temperature"]}
            assert {r["agpo_dual_clip_eps"] for r in g} == {g[0]["agpo_dual_clip_eps"]}
        assert ((tau >= 0.5) & (tau <= 1.5)).all() and ((eps >= 0.05) & (eps <= 0.4)).all()
        assert rows[step]["agpo_dual/temperature_mean"] == pytest.approx(tau.mean(), rel=1e-6)
        assert rows[step]["agpo_dual/clip_eps_mean"] == pytest.approx(eps.mean(), rel=1e-6)
        # the loss saw the same clips: its token-weighted mean lies within the prompts' range
        assert eps.min() - 1e-6 <= rows[step]["actor/agpo_dual_clip_eps_mean"] <= eps.max() + 1e-6
        assert rows[step]["agpo_dual/probe_tokens"] >= 4 * AgpoDualSettings().probe_samples  # a token at least each
    # the run's first prompt is the controller's start: c = 0, tau = tau_base (verl's dump sorts prompts by uid)
    assert 1.0 in {g[0]["agpo_dual_temperature"] for g in by_prompt(agpo_runs["dumps"][1]).values()}


def test_the_kl_penalty_runs_against_the_reference_model(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    assert rows[1]["actor/kl_coef"] == 0.03 and all("actor/kl_loss" in rows[s] for s in STEPS)


def test_the_rollout_samples_at_each_prompts_temperature(agpo_runs):
    """The rollout's log-probs are of the distribution it sampled from (softmax(logits / tau)), the actor's at
    tau_base: they part when the prompts' temperatures differ from it, as they do by default. (They agree to float
    error at tau_base: APO's run on this rollout, tests/e2e/test_apo_resume.py.)"""
    rows = {row["step"]: row for row in agpo_runs["rows"]}
    for step in STEPS:
        assert {r["agpo_dual_temperature"] for r in agpo_runs["dumps"][step]} != {1.0}
        assert rows[step]["training/rollout_probs_diff_max"] > 1e-3, step
