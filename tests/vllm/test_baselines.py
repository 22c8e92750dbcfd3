"""Dr. GRPO, CoDaPO and AGPO one step each with verl's vLLM rollout, as one Hydra multirun (one job per method, each its
own Ray session): the presets' estimators and losses on vLLM's samples, and vLLM's log-probs against the actor's.
GRPO's step is the first of tests/vllm/test_dead_engine.py's run, APO's tests/vllm/test_apo_sync.py."""

from __future__ import annotations

import pytest
from helpers.rehearsal_runs import checkpoint_root, run, tail

from recipe_apo.cpu import rehearse

METHODS = ("drgrpo", "codapo", "agpo")
# The audit's names of the methods it replays from a run's dump (recipe_apo/audit/analysis.py).
AUDITED = {"drgrpo": "Dr. GRPO", "agpo": "AGPO"}


@pytest.fixture(scope="module")
def baselines(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("vllm-baselines")
    result = run(rehearse.recipe_command(METHODS, tiny, "trainer.total_training_steps=1",
                                         "trainer.val_before_train=false", engine="vllm"),
                 workdir, "baselines", workdir / "metrics", jobs=len(METHODS))
    assert result.returncode == 0, tail(result)
    names = rehearse.experiment_names(result.log)
    assert [name.split("-")[0] for name in names] == list(METHODS)
    return {method: {"rows": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", name)),
                     "folder": checkpoint_root(workdir, name)} for method, name in zip(METHODS, names)}


@pytest.mark.parametrize("method", METHODS)
def test_each_preset_trains_one_step_on_vllms_samples(baselines, method):
    (row,) = baselines[method]["rows"]
    assert row["step"] == 1
    assert row["training/rollout_probs_diff_max"] <= 1e-4
    assert "actor/pg_clipfrac" in row and not any(key.startswith("apo/") for key in row)
    assert any(key.startswith("codapo/") for key in row) == (method == "codapo")
    assert any(key.startswith("agpo/") for key in row) == (method == "agpo")


@pytest.mark.parametrize("method", sorted(AUDITED))
def test_the_dumped_advantages_are_the_presets_estimator(baselines, method):
    from recipe_apo.audit.analysis import audit_run
    from recipe_apo.audit.dumps import load_run

    run_ = load_run(baselines[method]["folder"])
    assert [step.step for step in run_.steps] == [1] and len(run_.steps[0].scores) == 16
    assert AUDITED[method] in audit_run(run_)["logged"]["matches"]
