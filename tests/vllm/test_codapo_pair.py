"""method=codapo with the zero-variance denominator, 2 data-parallel workers and dynamic batch sizes: three steps,
the second of them trained on the first's kept prompts, each step's checkpoint saved. (A resume in the middle of a
pair, from the checkpoint folder the trainer's save wrote, and one whose ``codapo_state.json`` is corrupt or missing,
are tested one level down, through the trainer's restore and Ray's wrappers: tests/integration/test_trainer.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rehearsal_runs import checkpoint_root, dump, run, tail

from recipe_apo.cpu import rehearse

# ---- method=codapo with the zero-variance denominator: a pair and the first step of the next ----------------------
# Two data-parallel FSDP workers, each cutting its mini-batch into micro-batches by a token budget (as a GPU run
# with use_dynamic_bsz does): the hand-off of old log-probs, the zero-variance scale and the resampled step in
# that shape.
CODAPO_ARGS = ("algorithm.zero_variance=exclude", "data.shuffle=false", "trainer.save_freq=1",
               "trainer.val_before_train=false", "trainer.n_gpus_per_node=2",
               "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=80")


@pytest.fixture(scope="module")
def codapo_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("codapo")
    result = run(rehearse.recipe_command(["codapo"], tiny, *CODAPO_ARGS, "trainer.total_training_steps=3"),
                 workdir, "run", workdir / "metrics")
    assert result.returncode == 0, tail(result)
    experiment = rehearse.experiment_names(result.log)[0]
    ckpt = checkpoint_root(workdir, experiment)
    metrics = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", experiment))
    return {"ckpt": ckpt, "metrics": metrics, "dumps": {s: dump(ckpt / "rollouts" / f"{s}.jsonl") for s in (1, 2, 3)},
            "workdir": workdir, "tiny": tiny}


def prompt_uid(row: dict) -> str:
    """The prompt's uid of a V1 dump row (its uid is ``{prompt uid}_{rollout}_{output}``)."""
    return row["uid"].rsplit("_", 2)[0]


def groups_of(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(prompt_uid(row), []).append(row)
    return groups


def test_codapo_trains_the_even_step_on_the_kept_prompts_and_saves_them_with_the_odd_steps(codapo_runs):
    from collections import Counter

    from recipe_apo.methods.codapo.estimator import resample_order, select_prompts
    from recipe_apo.methods.state_codec import read_state

    CODAPO_STATE = "codapo_state.json"  # noqa: N806  (CoDaPO's state file: recipe_apo.methods.codapo)

    ckpt, dumps = codapo_runs["ckpt"], codapo_runs["dumps"]
    assert [row["step"] for row in codapo_runs["metrics"]] == [1, 2, 3]
    assert (ckpt / "global_step_1" / CODAPO_STATE).exists() and (ckpt / "global_step_3" / CODAPO_STATE).exists()
    assert not (ckpt / "global_step_2" / CODAPO_STATE).exists()  # nothing to keep after the second of a pair
    # The kept prompts are those of step 1 whose w_g reaches the 0.75 quantile of its four prompts' weights.
    step1 = groups_of(dumps[1])
    uids = list(step1)
    kept = select_prompts(uids, [prompt_uid(row) for row in dumps[1]], [row["codapo_weight"] for row in dumps[1]],
                          0.75)
    kept_inputs = sorted(step1[uids[i]][0]["input"] for i in kept)
    state, saved_step = read_state(str(ckpt / "global_step_1" / CODAPO_STATE), "codapo")
    assert state["step"] == saved_step == 1
    saved = [chat[0]["content"] for chat in state["kept"]["raw_prompt"]]
    assert len(saved) == len(kept_inputs) and all(any(f"\n{q}\n" in text for text in kept_inputs) for q in saved)
    # Step 2: the kept prompts repeated 4 times in place, cut to the 4 prompts of a step, each copy its own group.
    step2 = groups_of(dumps[2])
    assert len(step2) == 4 and all(len(rows) == 4 for rows in step2.values())
    # In the loader's order, which the saved kept prompts keep: which ones fill the batch depends on it.
    expected = Counter(saved[i] for i in resample_order(np.arange(len(saved)), 4, 4))
    asked = Counter(next(q for q in saved if f"\n{q}\n" in rows[0]["input"]) for rows in step2.values())
    assert asked == expected
    # Step 3 reads the dataloader again: the next four prompts (data.shuffle=false), none of step 1's.
    step3_inputs = {rows[0]["input"] for rows in groups_of(dumps[3]).values()}
    assert len(step3_inputs) == 4 and not step3_inputs & {rows[0]["input"] for rows in step1.values()}


def test_codapo_advantages_in_the_real_loop_are_weight_times_normalized_reward_times_the_zero_variance_scale(
        codapo_runs):
    logged = {row["step"]: row for row in codapo_runs["metrics"]}
    for step, rows in codapo_runs["dumps"].items():
        row_metrics = logged[step]
        live_tokens = total_tokens = 0
        group_weights = []
        for group in groups_of(rows).values():
            scores = np.array([row["score"] for row in group])
            weight = group[0]["codapo_weight"]
            assert all(row["codapo_weight"] == weight for row in group)
            group_weights.append(weight)
            accuracy = float(np.mean(scores == 1.0))
            if accuracy in (0.0, 1.0):
                assert weight == pytest.approx(0.1, abs=1e-7)  # d_w = 0: the offset alone
            else:
                # w_g = c_g d_w + 0.1 with a confidence c_g = exp(mean log-prob) in (0, 1]
                confidence = (weight - 0.1) / (4 * accuracy * (1 - accuracy))
                assert 0.0 < confidence <= 1.0
            tokens = sum(row["response_length"] for row in group)
            total_tokens += tokens
            live = scores.max() > scores.min()
            live_tokens += tokens if live else 0
            centered = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
            scale = row_metrics["zero_variance/scale"] if live else 1.0
            np.testing.assert_allclose([row["advantage"] for row in group], centered * weight * scale,
                                       rtol=1e-5, atol=1e-6)
        # token-mean (CoDaPO's aggregation): the scale is T / T_live
        assert row_metrics["zero_variance/live_share"] == pytest.approx(live_tokens / total_tokens)
        if live_tokens:
            assert row_metrics["zero_variance/scale"] == pytest.approx(total_tokens / live_tokens)
        assert row_metrics["codapo/weight_mean"] == pytest.approx(np.mean(group_weights))

