"""method=agpo through verl's whole loop on the CPU with the ``hf`` rollout: two steps, each checkpointed, then the
same command resumed for a third. Each step's rollout dump against the authors' pipeline (tests/helpers/
agpo_reference.py, on the AGPO preset's reward scale): the training rewards with the length bonus and the advantages,
a bonus in at least one step; verl's group filter left no group whose rewards are all equal; the audit's replay
reproduces the logged advantages, bonus included. AGPO on vLLM's samples is in tests/vllm/test_baselines.py's
multirun. Here rather than in tests/e2e for make test's time budget (two Ray sessions); make test-vllm runs it (the
hf rollout needs no vLLM)."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from helpers.agpo_reference import authors_advantages, authors_pipeline, authors_shaped
from helpers.paths import ROOT
from helpers.rehearsal_runs import checkpoint_root, dump, run, tail

from recipe_apo.cpu import rehearse

STEPS = 2
# The length bonus acts only in a group whose right answers differ in length; with the tiny task's exact grader
# they never do (tests/helpers/first_character_reward.py says what was measured). Groups of 8 sampled at
# temperature 2 and graded on the answer's first character have such groups (68% of the groups the filter keeps).
GROUP = 8
LENIENT_REWARD = ROOT / "tests" / "helpers" / "first_character_reward.py"
# One mini-batch a step (rehearse.RUN_OVERRIDES: 4 prompts a step and a mini-batch, 8 responses a micro-batch, no
# dynamic batch size, one epoch): the step's 4 x GROUP responses in this many micro-batches.
MICRO_BATCHES = 4 * GROUP // 8
ARGS = ("trainer.save_freq=1", "trainer.val_before_train=false", f"actor_rollout_ref.rollout.n={GROUP}",
        "actor_rollout_ref.rollout.temperature=2.0", f"reward.custom_reward_function.path={LENIENT_REWARD}")


@pytest.fixture(scope="module")
def agpo_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("agpo")
    results = {}
    for name, total in (("first", STEPS), ("second", STEPS + 1)):
        results[name] = run(rehearse.recipe_command(["agpo"], tiny, *ARGS, f"trainer.total_training_steps={total}"),
                            workdir, name, workdir / "metrics" / name)
        assert results[name].returncode == 0, tail(results[name])
    (experiment,) = rehearse.experiment_names(results["first"].log)
    ckpt = checkpoint_root(workdir, experiment)
    rows = {name: rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / name, experiment))
            for name in results}
    return {"rows": rows, "ckpt": ckpt,
            "dumps": {s: dump(ckpt / "rollouts" / f"{s}.jsonl") for s in range(1, STEPS + 2)}}


def authors_rule(scores, lengths, uids):
    """(training rewards, advantages) of the authors' pipeline on the scale the run trained on: the AGPO preset's
    ``algorithm.agpo.wrong_reward`` (-1: each 0/1 verdict rescored as their math_dapo scores it; 0: as scored)."""
    from recipe_apo.integration import presets

    if presets.compose("agpo").algorithm.agpo.get("wrong_reward", 0) == -1:
        return authors_pipeline(scores, lengths, uids)
    shaped = authors_shaped(scores, lengths, uids)
    return shaped, authors_advantages(shaped, uids)


def test_it_trains_checkpoints_and_resumes(agpo_runs):
    assert [row["step"] for row in agpo_runs["rows"]["first"]] == [1, 2]
    assert [row["step"] for row in agpo_runs["rows"]["second"]] == [3]  # resumed after step 2
    assert (agpo_runs["ckpt"] / "global_step_2").is_dir() and (agpo_runs["ckpt"] / "global_step_3").is_dir()
    for row in agpo_runs["rows"]["first"] + agpo_runs["rows"]["second"]:
        # The authors' max(loss, 0) on each micro-batch: verl sums the micro-batches' losses (actor/pg_loss) and
        # averages the clamp's 0/1 flag over them, a share of the step's MICRO_BATCHES that is 1 exactly when
        # every loss was set to 0.
        clipped, loss = row["actor/agpo_loss_clipped"], row["actor/pg_loss"]
        assert loss >= 0 and float(clipped * MICRO_BATCHES).is_integer(), (row["step"], clipped, loss)
        assert (loss == 0) == (clipped == 1), (row["step"], clipped, loss)
        assert row["agpo/saturated_share"] == 0.0  # the group filter lets no all-right or all-wrong group through


def test_each_dumped_step_is_the_authors_rewards_and_advantages(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]["first"] + agpo_runs["rows"]["second"]}
    bonused = 0
    for step, responses in agpo_runs["dumps"].items():
        uids = [r["uid"].rsplit("_", 2)[0] for r in responses]
        scores = [float(r["score"]) for r in responses]
        shaped, expected = authors_rule(scores, [int(r["response_length"]) for r in responses], uids)
        assert [r["agpo_shaped_reward"] for r in responses] == pytest.approx(shaped.tolist(), abs=1e-7)
        torch.testing.assert_close(torch.tensor([r["advantage"] for r in responses]), expected, rtol=2e-6,
                                   atol=2e-6)
        groups = defaultdict(set)
        for uid, score in zip(uids, scores):
            groups[uid].add(score)
        assert all(len(values) > 1 for values in groups.values()), step  # the filter kept live groups only
        assert rows[step]["agpo/shaped_reward_mean"] == pytest.approx(float(shaped.mean()), rel=1e-6)
        # A bonus acted in a group where a training reward exceeds 1 (its shortest right answer's is 1 + b): the
        # step's logged share of bonused responses is above 0 exactly then.
        acted = int((shaped > 1).sum())
        assert (rows[step]["agpo/bonus_share"] > 0) == (acted > 0), (step, rows[step]["agpo/bonus_share"])
        bonused += acted
    assert bonused > 0, "no length bonus in any step: the checks above never saw one act"


def test_the_audit_replays_the_runs_advantages_bonus_included(agpo_runs):
    from recipe_apo.audit.analysis import audit_run
    from recipe_apo.audit.dumps import load_run

    logged = audit_run(load_run(agpo_runs["ckpt"]))["logged"]
    assert "AGPO" in logged["matches"], logged
    # GRPO's advantages are AGPO's without the bonus (std-normalized: the reward scale cancels; no group is all
    # right or all wrong): where the bonus acted (the test above) they differ.
    assert "GRPO" not in logged["matches"], logged
