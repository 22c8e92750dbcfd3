"""Dr. GRPO as the paper scripts run it (truncated responses score 0, rollouts recorded, audited), in verl's
colocate_async trainer (the recipe's apo_colocate_async); the sync trainer runs APO's and CoDaPO's tests.

One baseline, one Ray session (about 75 CPU-seconds on 2 cores): Dr. GRPO rather than GRPO because it carries more
of the recipe's plumbing (L0 as verl's ``loss_scale_factor``, ``seq-mean-token-sum-norm``). GRPO differs from it in
two settings only, each checked one level down: its composed preset (tests/integration/test_recipe.py), its loss
in verl's FSDP2 engine (tests/e2e/test_gradient_invariance.py) and its advantages in the audit
(tests/audit/test_audit.py)."""

from __future__ import annotations

import json

import pytest
from helpers.rehearsal_runs import checkpoint_root, dump, run, tail

from recipe_apo.cpu import rehearse

STATE_FILE = "apo_state.json"  # APO's state file (recipe_apo.methods.apo's declaration)

# ---- the baseline, as the paper scripts run it: truncated responses score 0, rollouts recorded ---------------
# A cap of 3 tokens: a two-token answer (a 2-letter reversal, a sum of two digits) ends with <|im_end|> inside it, a
# three-token one (a 3-letter reversal) is cut before its end. Answers the tiny model gets right on any host: with a
# cap of 2 the check leaned on its one-digit sums, which it got right on an AVX2 host and wrong on an AVX-512 one.
TRUNCATION_CAP = 3


@pytest.fixture(scope="module")
def baselines(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("baselines")
    command = rehearse.recipe_command(["drgrpo"], tiny, "trainer.total_training_steps=1",
                                      "trainer.save_freq=1", "truncation=zero",
                                      f"data.max_response_length={TRUNCATION_CAP}",
                                      "trainer.validation_data_dir=${trainer.default_local_dir}/validation",
                                      "trainer.v1.trainer_mode=colocate_async")
    return workdir, run(command, workdir, "baselines", workdir / "metrics")


def test_drgrpo_trains_one_step(baselines):
    workdir, result = baselines
    assert result.returncode == 0, tail(result)
    names = rehearse.experiment_names(result.log)
    assert [name.split("-")[0] for name in names] == ["drgrpo"]
    for name in names:
        folder = checkpoint_root(workdir, name) / "global_step_1"
        assert (folder / "actor").is_dir() and not (folder / STATE_FILE).exists()
        (row,) = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", name))
        assert "actor/pg_clipfrac" in row and not any(key.startswith("apo/") for key in row)




def test_truncated_responses_score_zero_in_the_real_loop(baselines):
    workdir, result = baselines
    assert result.returncode == 0, tail(result)
    for name in rehearse.experiment_names(result.log):
        root = checkpoint_root(workdir, name)
        # Step 1's rollouts: 4 prompts x 4. verl's V1 trainer dumps no reward extras for them, only the uid.
        rollouts = dump(root / "rollouts" / "1.jsonl")
        assert len(rollouts) == 16 and {"input", "output", "gts", "score", "step", "uid"} <= set(rollouts[0])
        rows = dump(root / "validation" / "0.jsonl")  # greedy validation before training: every val prompt
        assert all(row["truncated"] in (0.0, 1.0) for row in rows)
        for row in rows:
            assert row["score"] == (0.0 if row["truncated"] else row["score_before_truncation"])
        # A right answer cut at the cap scores 0; one that ended within it keeps its 1.
        cut = [row for row in rows if row["truncated"] and row["output"].strip() == row["gts"]]
        ended = [row for row in rows if not row["truncated"] and row["score"] == 1.0]
        assert cut and all(row["score_before_truncation"] == 1.0 and row["score"] == 0.0 for row in cut)
        assert ended


def test_the_audit_tells_the_baseline_run_by_its_own_advantages(baselines, tmp_path):
    from recipe_apo.audit.__main__ import main as audit

    workdir, result = baselines
    assert result.returncode == 0, tail(result)
    names = rehearse.experiment_names(result.log)
    out = tmp_path / "audit"
    assert audit([str(checkpoint_root(workdir, name)) for name in names] + ["--out", str(out)]) == 0
    (report,) = json.loads((out / "audit.json").read_text())
    # Told apart from the others unless every group of the step was dead: then GRPO, Dr. GRPO and APO replay 0,
    # and AGPO too where every group was wrong (its length bonus rewards right answers only).
    dead, matches = report["dead"], report["logged"]["matches"]
    if dead["share"] < 1:
        assert matches == ["Dr. GRPO"], report["logged"]
    elif dead["all_wrong_share"] == 1:
        assert matches == ["GRPO", "Dr. GRPO", "APO", "AGPO"], report["logged"]
    else:
        assert matches[:3] == ["GRPO", "Dr. GRPO", "APO"], report["logged"]
    assert report["length"]["truncated_share"] is not None and (out / "audit.png").exists()
