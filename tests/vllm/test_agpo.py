"""method=agpo through verl's whole loop on the CPU with the ``hf`` rollout: two steps, each checkpointed, then the
same command resumed for a third. Each step's rollout dump against the authors' code (tests/helpers/agpo_reference.py):
the training rewards with the length bonus and the advantages; verl's group filter left no group whose rewards are
all equal. AGPO on vLLM's samples is in tests/vllm/test_baselines.py's multirun. Here rather than in tests/e2e for
make test's time budget (two Ray sessions); make test-vllm runs it (the hf rollout needs no vLLM)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from helpers.agpo_reference import authors_advantages, authors_shaped
from helpers.rehearsal_runs import checkpoint_root, dump, run, tail

from recipe_apo.cpu import rehearse

STEPS = 2
ARGS = ("trainer.save_freq=1", "trainer.val_before_train=false")


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


def test_it_trains_checkpoints_and_resumes(agpo_runs):
    assert [row["step"] for row in agpo_runs["rows"]["first"]] == [1, 2]
    assert [row["step"] for row in agpo_runs["rows"]["second"]] == [3]  # resumed after step 2
    assert (agpo_runs["ckpt"] / "global_step_2").is_dir() and (agpo_runs["ckpt"] / "global_step_3").is_dir()
    for row in agpo_runs["rows"]["first"] + agpo_runs["rows"]["second"]:
        assert 0 <= row["actor/agpo_loss_clipped"] <= 1 and np.isfinite(row["actor/pg_loss"])
        assert row["agpo/saturated_share"] == 0.0  # the group filter lets no all-right or all-wrong group through


def test_each_dumped_step_is_the_authors_rewards_and_advantages(agpo_runs):
    rows = {row["step"]: row for row in agpo_runs["rows"]["first"] + agpo_runs["rows"]["second"]}
    for step, responses in agpo_runs["dumps"].items():
        uids = [r["uid"].rsplit("_", 2)[0] for r in responses]
        scores = [float(r["score"]) for r in responses]
        shaped = authors_shaped(scores, [int(r["response_length"]) for r in responses], uids)
        assert [r["agpo_shaped_reward"] for r in responses] == pytest.approx(shaped.tolist(), abs=1e-7)
        expected = authors_advantages(shaped, uids)
        torch.testing.assert_close(torch.tensor([r["advantage"] for r in responses]), expected, rtol=2e-6,
                                   atol=2e-6)
        groups = defaultdict(set)
        for uid, score in zip(uids, scores):
            groups[uid].add(score)
        assert all(len(values) > 1 for values in groups.values()), step  # the filter kept live groups only
        assert rows[step]["agpo/shaped_reward_mean"] == pytest.approx(float(shaped.mean()), rel=1e-6)
