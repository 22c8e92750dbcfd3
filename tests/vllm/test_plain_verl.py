"""README's plain ``python -m verl.trainer.main_ppo`` command, as written but for the model and the data (the tiny
ones) and what a CPU needs (``+rehearsal=cpu``), with its own rollout, verl's vLLM one: one step trains with APO
and saves the anchor through verl's checkpoint callback. That the command names APO's estimator, loss and callback,
and that it composes with verl's own config, is checked without Ray in tests/integration/test_documented_paths.py;
the whole loop is here, with the engine GPU users run it with, for ``make test``'s time budget."""

from __future__ import annotations

import math

import pytest
from helpers.rehearsal_runs import checkpoint_root, run_readme_plain_verl, state, tail

from recipe_apo.cpu import rehearse

# What the rehearsal replaces in README's command: the model and the data files (the rollout stays README's).
REPLACED = ("actor_rollout_ref.model.path=", "data.")


@pytest.fixture(scope="module")
def plain_verl(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("plain")
    result = run_readme_plain_verl(tiny, workdir, "plain", REPLACED)
    return workdir, result


def test_plain_verl_trains_with_apo_on_vllms_samples_and_saves_the_anchor(plain_verl):
    workdir, result = plain_verl
    assert result.returncode == 0, tail(result)
    saved = state(checkpoint_root(workdir, "plain") / "global_step_1")
    assert list(saved["anchors"]) == ["global"] and saved["anchors"]["global"]["steps"] == 1
    (row,) = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", "plain"))
    assert 0.0 < row["actor/apo_gate_weight"] <= 1.0  # the apo loss ran in verl's worker
    assert math.isfinite(row["critic/advantages/max"])
    assert row["training/rollout_probs_diff_max"] <= 1e-4  # vLLM generated: its log-probs are the actor's
