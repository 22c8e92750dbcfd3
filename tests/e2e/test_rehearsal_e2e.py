"""End to end, on a CPU: verl's whole training loop through the recipe's and verl's own entry points.

Each fixture is one real run (Ray, TransferQueue, the agent loop with the ``hf`` rollout, the reward loop, the
FSDP2 actor, the estimator in the driver, the loss in the worker, checkpoints, the file logger) on the tiny
model and dataset of ``recipe_apo.cpu.make_tiny``; several tests read each run. Seven Ray sessions in all,
about a minute each on 2 cores (mostly the start: every Ray worker imports torch, transformers and verl).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from recipe_apo.methods.anchor import AnchorBook
from recipe_apo.integration.checkpoint import STATE_FILE, load_anchor_state
from recipe_apo.cpu import rehearse
from recipe_apo.cpu.make_tiny import make_tiny
from recipe_apo.methods.apo_settings import ApoSettings
from repo_paths import ROOT

README = ROOT / "README.md"
SOURCES = ("tiny_add", "tiny_reverse")
# The train row whose reward is NaN. With data.shuffle=false and 4 prompts a step, it is in step 4's batch.
POISON_INDEX = 12

NAN_REWARD = f'''
import math
from recipe_apo.cpu.reward import compute_score as task_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if extra_info and extra_info.get("split") == "train" and extra_info.get("index") == {POISON_INDEX}:
        return math.nan
    return task_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    paths = make_tiny(root, progress=None)
    nan_reward = root / "nan_reward.py"
    nan_reward.write_text(NAN_REWARD)
    return {**paths, "nan_reward": nan_reward}


# A hung run fails its tests instead of holding CI: each run takes about a minute a job.
RUN_TIMEOUT_S = 600


def run(command, workdir: Path, name: str, metrics: Path, env_extra=None) -> rehearse.RunResult:
    env = {**rehearse.rehearsal_env(metrics), **(env_extra or {})}
    return rehearse.run_logged(command, workdir / f"{name}.log", cwd=workdir, env=env, label=name,
                               timeout=RUN_TIMEOUT_S)


def tail(result: rehearse.RunResult, lines: int = 40) -> str:
    return "\n".join(result.log.read_text().splitlines()[-lines:])


def checkpoint_root(workdir: Path, experiment: str) -> Path:
    return workdir / "checkpoints" / rehearse.PROJECT / experiment


def state(folder: Path) -> dict:
    return json.loads((folder / STATE_FILE).read_text())


# ---- method=apo, per-data-source anchors: 2 steps, then a resume that meets a NaN reward at step 4 ----------------
APO_ARGS = ("algorithm.apo.anchor_scope=data_source", "data.shuffle=false", "trainer.save_freq=1")


@pytest.fixture(scope="module")
def apo_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("apo")
    paths = {**tiny, "reward": tiny["nan_reward"]}
    first = run(rehearse.recipe_command(["apo"], paths, *APO_ARGS, "trainer.total_training_steps=2"),
                workdir, "first", workdir / "metrics" / "first")
    assert first.returncode == 0, tail(first)
    experiment = rehearse.experiment_names(first.log)[0]
    second = run(rehearse.recipe_command(["apo"], paths, *APO_ARGS, "trainer.total_training_steps=4"),
                 workdir, "second", workdir / "metrics" / "second")
    return {
        "workdir": workdir, "experiment": experiment, "first": first, "second": second,
        "ckpt": checkpoint_root(workdir, experiment),
        "metrics_first": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / "first", experiment)),
        "metrics_second": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / "second", experiment)),
    }


def test_apo_run_saves_one_anchor_per_data_source_in_every_checkpoint(apo_runs):
    ckpt = apo_runs["ckpt"]
    for step in (1, 2):
        saved = state(ckpt / f"global_step_{step}")
        assert saved["global_step"] == step
        assert sorted(saved["anchors"]) == sorted(SOURCES)
        assert all(anchor["steps"] == step for anchor in saved["anchors"].values())
        assert (ckpt / f"global_step_{step}" / "actor").is_dir()


def test_apo_metrics_reach_the_file_logger_and_match_the_saved_anchors(apo_runs):
    rows = apo_runs["metrics_first"]
    assert [row["step"] for row in rows] == [1, 2]
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
    """Replay step 3 from global_step_2's state with step 3's logged success rates: global_step_3 must match
    bit for bit, which holds only if the resumed run started from exactly the saved anchors."""
    rows = apo_runs["metrics_second"]
    assert rows[0]["step"] == 3, "the second run must resume at step 3"
    book = AnchorBook()
    book.load_state_dict(state(apo_runs["ckpt"] / "global_step_2"))
    settings = ApoSettings()
    for source in SOURCES:
        key = f"apo/batch_success/{source}"
        if key in rows[0]:
            book.anchor(source).update(rows[0][key], settings.eta, settings.eta_min, settings.history)
    assert book.state_dict()["anchors"] == state(apo_runs["ckpt"] / "global_step_3")["anchors"]


def test_nan_reward_stops_the_run_with_the_estimators_error_and_keeps_the_last_checkpoint(apo_runs):
    second, ckpt = apo_runs["second"], apo_runs["ckpt"]
    assert second.returncode != 0
    output = second.log.read_text()
    assert "recipe-apo: error: token_level_rewards: 4 of 16 responses have NaN/inf rewards" in output
    assert not (ckpt / "global_step_4").exists()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert load_anchor_state(str(ckpt / "global_step_3"), ApoSettings(anchor_scope="data_source"))
    weights = torch.load(ckpt / "global_step_3" / "actor" / "model_world_size_1_rank_0.pt", weights_only=False)
    assert any("embed_tokens" in name for name in weights)


def test_the_rollout_dump_carries_the_audits_fields_and_the_audit_replays_the_run(apo_runs):
    from recipe_apo.audit import stats
    from recipe_apo.audit.analysis import audit_run
    from recipe_apo.audit.dumps import load_run

    # The checkpoint folder: its rollouts/ (rehearse.RUN_OVERRIDES), steps 1, 2 and, resumed, 3.
    run = load_run(apo_runs["ckpt"])
    assert [step.step for step in run.steps] == [1, 2, 3] and run.length_source == "dump"
    logged = {row["step"]: row for row in apo_runs["metrics_first"] + apo_runs["metrics_second"]}
    for step in run.steps:
        assert len(step.scores) == 16 and set(step.data_sources) <= set(SOURCES)
        assert np.all((step.lengths >= 1) & (step.lengths <= 16))
        # advantage = Phi_i x the group-centered reward, exactly as the estimator computed it
        codes, n = stats.group_codes(step.groups)
        centered = step.scores - stats.group_rates(codes, n, step.scores)[codes]
        np.testing.assert_allclose(step.logged_advantages, step.logged_phi * centered, atol=1e-6)
        for source, anchor in zip(step.data_sources, step.logged_anchor):
            assert anchor == logged[step.step][f"apo/anchor/{source}"]  # C_t of the response's data source
    # A fresh anchor replayed over the three steps gives the run's own advantages: the resume was exact.
    result = audit_run(run, {"anchor_scope": "data_source"})
    assert result["logged"]["matches"] == ["APO"], result["logged"]


# ---- plain verl, as README's plain-verl section gives it -----------------------------------------------------------
def readme_plain_verl_overrides() -> list[str]:
    """README's plain-verl command, without what the rehearsal replaces (rollout engine, model, data files)."""
    text = README.read_text()
    start = text.index("python -m verl.trainer.main_ppo \\")
    block = text[start:text.index("```", start)].replace("\\\n", " ")
    replaced = ("actor_rollout_ref.rollout.name=", "actor_rollout_ref.model.path=", "data.")
    return [arg for arg in shlex.split(block)[3:] if not arg.startswith(replaced)]


@pytest.fixture(scope="module")
def plain_verl(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("plain")
    command = [
        sys.executable, "-m", "verl.trainer.main_ppo", "hydra.searchpath=[pkg://recipe_apo.conf]", "+rehearsal=cpu",
        *readme_plain_verl_overrides(), *rehearse.tiny_overrides(tiny), *rehearse.RUN_OVERRIDES,
        "actor_rollout_ref.rollout.name=hf", "trainer.experiment_name=plain", "trainer.total_training_steps=1",
        "trainer.save_freq=1", "trainer.val_before_train=false",
    ]
    result = run(command, workdir, "plain", workdir / "metrics",
                 env_extra={"VERL_USE_EXTERNAL_MODULES": "recipe_apo.cpu.activate"})
    return workdir, result


def test_readme_plain_verl_command_is_apo(tiny):
    overrides = readme_plain_verl_overrides()
    assert "algorithm.adv_estimator=apo" in overrides
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=apo" in overrides
    assert "trainer.checkpoint_callback_class=recipe_apo.checkpoint.AnchorCheckpointCallback" in overrides


def test_plain_verl_trains_with_apo_and_saves_the_anchor(plain_verl):
    workdir, result = plain_verl
    assert result.returncode == 0, tail(result)
    saved = state(checkpoint_root(workdir, "plain") / "global_step_1")
    assert list(saved["anchors"]) == ["global"] and saved["anchors"]["global"]["steps"] == 1
    (row,) = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", "plain"))
    assert 0.0 < row["actor/apo_gate_weight"] <= 1.0  # the apo loss ran in verl's worker
    assert math.isfinite(row["critic/advantages/max"])


# ---- a Hydra multirun of two APO jobs, with verl's KL loss (the reference-model path) ---------------------------
@pytest.fixture(scope="module")
def multirun(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("multirun")
    command = rehearse.recipe_command(["apo"], tiny, "algorithm.apo.lambda_scale=1.1,2.0",
                                      "actor_rollout_ref.actor.use_kl_loss=true",
                                      "trainer.total_training_steps=3", "trainer.save_freq=1",
                                      "trainer.val_before_train=false")
    command.insert(3, "-m")
    result = run(command, workdir, "multirun", workdir / "metrics")
    return workdir, result


def test_multirun_jobs_each_get_their_own_experiment_and_a_fresh_anchor(multirun):
    workdir, result = multirun
    assert result.returncode == 0, tail(result)
    names = rehearse.experiment_names(result.log)
    assert len(names) == 2 and len(set(names)) == 2
    assert "apo.lambda_scale=1.1" in names[0] and "apo.lambda_scale=2.0" in names[1]
    for name in names:
        saved = state(checkpoint_root(workdir, name) / "global_step_1")["anchors"]["global"]
        # A fresh anchor has seen exactly this job's first step; one carried over would have seen three.
        assert saved["steps"] == 1 and len(saved["history"]) == 1
        first = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", name))[0]
        assert first["apo/anchor"] == saved["value"]


def test_kl_loss_runs_against_the_reference_model(multirun):
    from recipe_apo.audit import stats
    from recipe_apo.audit.dumps import load_run

    workdir, result = multirun
    assert result.returncode == 0, tail(result)
    moved = False
    for name in rehearse.experiment_names(result.log):
        rows = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", name))
        # Step 1's policy is the reference model itself.
        assert rows[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
        # A step whose groups all scored alike has every advantage 0 (on this toy task it happens: see README's
        # bias audit); after the first step with a signal the policy has left the reference model.
        steps = load_run(checkpoint_root(workdir, name)).steps
        live = [not stats.dead_groups(s.scores, *stats.group_codes(s.groups)).all() for s in steps]
        for t in range(1, len(rows)):
            if any(live[:t]):
                assert rows[t]["actor/kl_loss"] > 0.0, (name, t + 1)
                moved = True
    assert moved, "no step of either job had a group with a signal: nothing to check the KL term against"


# ---- the two baselines, as the paper scripts run them: truncated responses score 0, rollouts recorded -----------
# A cap of 2 tokens: a one-token answer ends with <|im_end|> inside it, a two-token answer is cut before its end.
TRUNCATION_CAP = 2


@pytest.fixture(scope="module")
def baselines(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("baselines")
    command = rehearse.recipe_command(["grpo", "drgrpo"], tiny, "trainer.total_training_steps=1",
                                      "trainer.save_freq=1", "truncation=zero",
                                      f"data.max_response_length={TRUNCATION_CAP}",
                                      "trainer.validation_data_dir=${trainer.default_local_dir}/validation")
    return workdir, run(command, workdir, "baselines", workdir / "metrics")


def test_grpo_and_drgrpo_each_train_one_step(baselines):
    workdir, result = baselines
    assert result.returncode == 0, tail(result)
    names = rehearse.experiment_names(result.log)
    assert [name.split("-")[0] for name in names] == ["grpo", "drgrpo"]
    for name in names:
        folder = checkpoint_root(workdir, name) / "global_step_1"
        assert (folder / "actor").is_dir() and not (folder / STATE_FILE).exists()
        (row,) = rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", name))
        assert "actor/pg_clipfrac" in row and not any(key.startswith("apo/") for key in row)


def dump(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


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


def test_the_audit_tells_each_baseline_run_by_its_own_advantages(baselines, tmp_path):
    from recipe_apo.audit.__main__ import main as audit

    workdir, result = baselines
    assert result.returncode == 0, tail(result)
    names = rehearse.experiment_names(result.log)
    out = tmp_path / "audit"
    assert audit([str(checkpoint_root(workdir, name)) for name in names] + ["--out", str(out)]) == 0
    grpo, drgrpo = json.loads((out / "audit.json").read_text())
    for run, method in ((grpo, "GRPO"), (drgrpo, "Dr. GRPO")):
        # Told apart unless every group of the step was dead (then all three replays give 0 everywhere).
        expected = [method] if run["dead"]["share"] < 1 else ["GRPO", "Dr. GRPO", "APO"]
        assert run["logged"]["matches"] == expected, run["logged"]
    assert grpo["length"]["truncated_share"] is not None and (out / "audit.png").exists()


# ---- method=codapo with the zero-variance denominator: step 1, then a resume in the middle of its pair ----------
CODAPO_ARGS = ("algorithm.zero_variance=exclude", "data.shuffle=false", "trainer.save_freq=1",
               "trainer.val_before_train=false")


@pytest.fixture(scope="module")
def codapo_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("codapo")
    first = run(rehearse.recipe_command(["codapo"], tiny, *CODAPO_ARGS, "trainer.total_training_steps=1"),
                workdir, "first", workdir / "metrics" / "first")
    assert first.returncode == 0, tail(first)
    experiment = rehearse.experiment_names(first.log)[0]
    second = run(rehearse.recipe_command(["codapo"], tiny, *CODAPO_ARGS, "trainer.total_training_steps=3"),
                 workdir, "second", workdir / "metrics" / "second")
    assert second.returncode == 0, tail(second)
    ckpt = checkpoint_root(workdir, experiment)
    metrics = [rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / name, experiment))
               for name in ("first", "second")]
    return {"ckpt": ckpt, "metrics": metrics, "dumps": {s: dump(ckpt / "rollouts" / f"{s}.jsonl") for s in (1, 2, 3)}}


def prompt_uid(row: dict) -> str:
    """The prompt's uid of a V1 dump row (its uid is ``{prompt uid}_{rollout}_{output}``)."""
    return row["uid"].rsplit("_", 2)[0]


def groups_of(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(prompt_uid(row), []).append(row)
    return groups


def test_codapo_resumes_in_the_middle_of_a_pair_and_trains_the_even_step_on_the_kept_prompts(codapo_runs):
    from collections import Counter

    from recipe_apo.methods.codapo import resample_order, select_prompts
    from recipe_apo.integration.resampling import STATE_FILE as CODAPO_STATE

    ckpt, dumps = codapo_runs["ckpt"], codapo_runs["dumps"]
    assert [row["step"] for row in codapo_runs["metrics"][1]] == [2, 3]  # the second run resumed at step 2
    assert (ckpt / "global_step_1" / CODAPO_STATE).exists() and (ckpt / "global_step_3" / CODAPO_STATE).exists()
    assert not (ckpt / "global_step_2" / CODAPO_STATE).exists()  # nothing to keep after the second of a pair
    # The kept prompts are those of step 1 whose w_g reaches the 0.75 quantile of its four prompts' weights.
    step1 = groups_of(dumps[1])
    uids = list(step1)
    kept = select_prompts(uids, [prompt_uid(row) for row in dumps[1]], [row["codapo_weight"] for row in dumps[1]],
                          0.75)
    kept_inputs = sorted(step1[uids[i]][0]["input"] for i in kept)
    state = torch.load(ckpt / "global_step_1" / CODAPO_STATE, weights_only=False)
    assert state["step"] == 1
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
    logged = {row["step"]: row for rows in codapo_runs["metrics"] for row in rows}
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
