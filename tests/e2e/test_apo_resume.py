"""method=apo end to end: per-data-source anchors, verl's KL loss against the reference model, dynamic batch
sizes, 3 steps; then a resume that continues the saved anchors and meets a NaN reward at step 5; the rollout dump
and the audit on it. One fixture for all of it: every Ray session costs about 60 CPU-seconds of start-up on 2 cores.

One FSDP worker: a second costs a third more CPU a session (two more processes and gloo), and what two workers
change is the loss's, not the anchor's. The whole loop on 2 data-parallel workers with dynamic batch sizes is
CoDaPO's (tests/vllm/test_codapo_pair.py; APO's in make test-vllm: tests/vllm/test_two_nodes.py and
test_async_data_parallel.py); that APO's update is the same with 1 and 2 workers, and with any cut into
micro-batches, is checked one level down, through verl's FSDP2 engine for every preset
(tests/e2e/test_gradient_invariance.py); that the estimator does not depend on the order verl balances rows into,
by property tests (tests/methods/test_estimator.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.rehearsal_runs import SOURCES, checkpoint_root, dump, run, runtime_state, state, tail
from omegaconf import OmegaConf

from recipe_apo.cpu import rehearse
from recipe_apo.integration.checkpoint import restore_state
from recipe_apo.methods import catalog
from recipe_apo.methods.apo.anchor import AnchorBook
from recipe_apo.methods.apo.settings import ApoSettings

# The train row whose reward is NaN. With data.shuffle=false and 4 prompts a step, it is in step 5's batch.
POISON_INDEX = 16

NAN_REWARD = f'''
import math
from recipe_apo.cpu.reward import compute_score as task_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if extra_info and extra_info.get("split") == "train" and extra_info.get("index") == {POISON_INDEX}:
        return math.nan
    return task_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
'''


# ---- method=apo with per-data-source anchors and KL, 3 steps; then a resume --------------------------------------
# A token budget below a step's tokens: verl cuts each mini-batch into several micro-batches of different sizes
# (prompts of the tiny dataset plus responses: about 16 tokens a sequence, 16 sequences a step).
TOKEN_BUDGET = 80  # = data.max_prompt_length + data.max_response_length: the longest sequence must fit
WORKERS = 1
APO_ARGS = ("algorithm.apo.anchor_scope=data_source", "data.shuffle=false", "trainer.save_freq=1",
            "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.apo.lambda_scale=1.1",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={TOKEN_BUDGET}", f"trainer.n_gpus_per_node={WORKERS}",
            # The hf rollout samples each request from its own seed: the same samples every run on a machine.
            "actor_rollout_ref.rollout.full_determinism=true")
LAMBDA = 1.1


@pytest.fixture(scope="module")
def apo_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("apo")
    nan_reward = workdir / "nan_reward.py"
    nan_reward.write_text(NAN_REWARD)
    paths = {**tiny, "reward": nan_reward}
    first = run(rehearse.recipe_command(["apo"], paths, *APO_ARGS, "trainer.total_training_steps=3"),
                workdir, "first", workdir / "metrics" / "first")
    assert first.returncode == 0, tail(first)
    (experiment,) = rehearse.experiment_names(first.log)
    # The same command with more steps resumes (resume_mode=auto): the step count is not part of the run's name.
    second = run(rehearse.recipe_command(["apo"], paths, *APO_ARGS, "trainer.total_training_steps=5"),
                 workdir, "second", workdir / "metrics" / "second")
    return {
        "workdir": workdir, "experiment": experiment, "first": first, "second": second,
        "ckpt": checkpoint_root(workdir, experiment),
        "metrics_first": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / "first", experiment)),
        "metrics_second": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / "second", experiment)),
    }


def test_apo_run_saves_one_anchor_per_data_source_in_every_checkpoint(apo_runs):
    ckpt = apo_runs["ckpt"]
    for step in (1, 2, 3):
        saved = state(ckpt / f"global_step_{step}")
        assert saved["global_step"] == step
        assert sorted(saved["anchors"]) == sorted(SOURCES)
        assert all(anchor["steps"] == step for anchor in saved["anchors"].values())
        assert (ckpt / f"global_step_{step}" / "actor").is_dir()


def test_apo_metrics_reach_the_file_logger_and_match_the_saved_anchors(apo_runs):
    rows = apo_runs["metrics_first"]
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        saved = state(apo_runs["ckpt"] / f"global_step_{row['step']}")["anchors"]
        for source in SOURCES:
            assert row[f"apo/anchor/{source}"] == saved[source]["value"]
            assert 0.0 <= row[f"apo/batch_success/{source}"] <= 1.0
        # The loss ran in the FSDP worker and verl timed every stage.
        assert 0.0 < row["actor/apo_gate_weight"] <= 1.0
        assert all(row[f"timing_s/{stage}"] > 0 for stage in ("gen", "old_log_prob", "adv", "update_actor"))
    # The hf rollout's log-probs are the actor's: same model, same tokens, same temperature.
    assert rows[0]["training/rollout_probs_diff_max"] < 1e-4


def test_resume_continues_the_anchor_from_exactly_the_saved_state(apo_runs):
    """Replay step 4 from global_step_3's state with step 4's logged success rates: global_step_4 must match
    bit for bit, which holds only if the resumed run started from exactly the saved anchors."""
    rows = apo_runs["metrics_second"]
    assert rows[0]["step"] == 4, "the second run must resume at step 4"
    book = AnchorBook()
    book.load_state_dict(runtime_state(apo_runs["ckpt"] / "global_step_3"))
    settings = ApoSettings()
    for source in SOURCES:
        key = f"apo/batch_success/{source}"
        if key in rows[0]:
            book.anchor(source).update(rows[0][key], settings.eta, settings.eta_min, settings.history)
    assert book.state_dict()["anchors"] == state(apo_runs["ckpt"] / "global_step_4")["anchors"]


def test_nan_reward_stops_the_run_with_the_estimators_error_and_keeps_the_last_checkpoint(apo_runs):
    second, ckpt = apo_runs["second"], apo_runs["ckpt"]
    assert second.returncode != 0
    output = second.log.read_text()
    assert "recipe-apo: error: token_level_rewards: 4 of 16 responses have NaN/inf rewards" in output
    assert not (ckpt / "global_step_5").exists()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    config = OmegaConf.create({"algorithm": {"adv_estimator": "apo", "apo": {"anchor_scope": "data_source"}}})
    assert restore_state(catalog.method("apo").build_runtime(config), str(ckpt / "global_step_4"), 4)
    for rank in range(WORKERS):
        weights = torch.load(ckpt / "global_step_4" / "actor" / f"model_world_size_{WORKERS}_rank_{rank}.pt",
                             weights_only=False)
        assert any("embed_tokens" in name for name in weights)


def test_the_rollout_dump_carries_the_audits_fields_and_the_audit_replays_the_run(apo_runs):
    from recipe_apo.audit.analysis import audit_run
    from recipe_apo.audit.dumps import load_run
    from recipe_apo.methods import groups

    # The checkpoint folder: its rollouts/ (rehearse.RUN_OVERRIDES), steps 1 to 3 and, resumed, 4.
    run = load_run(apo_runs["ckpt"])
    assert [step.step for step in run.steps] == [1, 2, 3, 4] and run.length_source == "dump"
    logged = {row["step"]: row for row in apo_runs["metrics_first"] + apo_runs["metrics_second"]}
    for step in run.steps:
        assert len(step.scores) == 16 and set(step.data_sources) <= set(SOURCES)
        assert np.all((step.lengths >= 1) & (step.lengths <= 16))
        # advantage = Phi_i x the group-centered reward, exactly as the estimator computed it
        codes, n = groups.group_codes(step.groups)
        centered = step.scores - groups.group_rates(codes, n, step.scores)[codes]
        np.testing.assert_allclose(step.logged_advantages, step.logged_phi * centered, atol=1e-6)
        for source, anchor in zip(step.data_sources, step.logged_anchor):
            assert anchor == logged[step.step][f"apo/anchor/{source}"]  # C_t of the response's data source
    # A fresh anchor replayed over the four steps gives the run's own advantages: the resume was exact.
    result = audit_run(run, {"anchor_scope": "data_source", "lambda_scale": LAMBDA})
    assert result["logged"]["matches"] == ["APO"], result["logged"]


def test_kl_loss_runs_against_the_reference_model(apo_runs):
    from recipe_apo.audit.dumps import load_run
    from recipe_apo.methods import group_stats, groups

    rows = apo_runs["metrics_first"] + apo_runs["metrics_second"]  # steps 1 to 4 (the resumed run's step 4)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    # Step 1's policy is the reference model itself.
    assert rows[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    # A step whose groups all scored alike has every advantage 0 (on this toy task it happens: see the bias
    # audit's example); after the first step with a signal the policy has left the reference model.
    steps = load_run(apo_runs["ckpt"]).steps
    live = [not group_stats.dead_groups(s.scores, *groups.group_codes(s.groups)).all() for s in steps]
    moved = False
    for t in range(1, len(rows)):
        if any(live[:t]):
            assert rows[t]["actor/kl_loss"] > 0.0, t + 1
            moved = True
    assert moved, "none of steps 1 to 3 had a group with a signal: nothing to check the KL term against"


def test_the_worker_cut_its_mini_batch_by_the_token_budget(apo_runs):
    for row in apo_runs["metrics_first"]:
        # verl's per-worker token count: above the budget, so each mini-batch went in >= 2 micro-batches.
        assert row["global_seqlen/min"] > TOKEN_BUDGET, row["global_seqlen/min"]


def test_the_dump_has_one_row_per_response(apo_runs):
    for step in (1, 2, 3, 4):
        rows = dump(apo_runs["ckpt"] / "rollouts" / f"{step}.jsonl")
        assert len(rows) == 16 and len({row["uid"] for row in rows}) == 16  # 4 prompts x 4 responses, once each
