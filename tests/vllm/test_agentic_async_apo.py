"""method=apo in an agentic, asynchronous run, in the real loop: verl's colocate_async trainer (rollouts go on
across weight updates; requests under way at an update are aborted and resumed with their tokens so far) and the
rehearsal's two-turn loop returning two outputs for odd sessions and one for even ones (recipe_apo/cpu/agent_loops.py),
so a prompt's trajectories have different numbers of output rows. 4 steps with a checkpoint each, in one Ray session.

The recipe's trainer for the mode (apo_colocate_async) gives APO verl's final-output rule (one response per
trajectory, its final output: the anchor's batch success the share of successful trajectories, every output of a
trajectory its advantage), saves the anchor with every checkpoint, and dumps each response's staleness. The restore
is the sync trainer's own (the same ``_load_checkpoint`` hook, tests/integration/test_trainer.py), resumed in the
real loop by tests/e2e/test_apo_resume.py.

It runs on the ``hf`` backend, which can be paced (vLLM cannot): it is in tests/vllm, which make test-vllm runs, for
make test's time budget; make test runs verl's colocate_async trainer with Dr. GRPO (tests/e2e/test_baselines.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rehearsal_runs import assert_each_checkpoint_holds_its_steps_anchor, checkpoint_root, dump, run, tail

from recipe_apo.cpu import agent_loops, rehearse

# The tiny model, warmed up on single-turn prompts, almost never answers its second turn right, and its answers are
# one or two characters long: a reward on their length's parity was 0 for every output of three steps once (CI), and
# then nothing told the trajectory rule from the row rule. A pseudo-random bit of each output's text (md5) gives both
# outcomes wherever the texts differ, and they do (one and two outputs per session, four prompts).
HASHED_TEXT_REWARD = '''
import hashlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(hashlib.md5(solution_str.encode()).digest()[0] % 2 == 0)
'''
STEPS = 4
LOOP_ARGS = (f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops.CONFIG_PATH}",
             "actor_rollout_ref.rollout.agent.default_agent_loop=recipe_two_turn_alternate",
             "data.max_response_length=48",  # two turns and the user turn; a later override wins over 16
             "trainer.v1.trainer_mode=colocate_async", "trainer.val_before_train=false", "trainer.save_freq=1",
             "data.shuffle=false",
             # Generation paced and cut in batches of 6, as a GPU server's would be: requests are still under way
             # when the trainer has its batch and aborts them (a tiny model otherwise ends everything at once).
             "actor_rollout_ref.rollout.max_num_seqs=6",
             "+ray_kwargs.ray_init.runtime_env.env_vars.RECIPE_APO_HF_SECONDS_PER_TOKEN='0.05'",
             # Two batches generated ahead, not verl's one: with one, a CI run under load (the training step slower,
             # the paced generation not) had no request under way at any update.
             "trainer.v1.colocate_async.num_warmup_batches=2")


@pytest.fixture(scope="module")
def agentic_runs(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("agentic")
    reward = workdir / "hashed_text.py"
    reward.write_text(HASHED_TEXT_REWARD)
    paths = {**tiny, "reward": reward}
    result = run(rehearse.recipe_command(["apo"], paths, *LOOP_ARGS, f"trainer.total_training_steps={STEPS}"),
                 workdir, "agentic", workdir / "metrics")
    assert result.returncode == 0, tail(result)
    (experiment,) = rehearse.experiment_names(result.log)
    return {"metrics": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", experiment)),
            "ckpt": checkpoint_root(workdir, experiment),
            "rollouts": checkpoint_root(workdir, experiment) / "rollouts", "log": result.log}


def trajectories(rows: list[dict]) -> dict[str, list[dict]]:
    """verl's rows ``{uid}_{session}_{index}`` (padding rows left out) by trajectory, in output order."""
    found: dict[str, list[dict]] = {}
    for row in rows:
        if not row["uid"].startswith("pad"):
            found.setdefault(row["uid"].rsplit("_", 1)[0], []).append(row)
    return {key: sorted(outputs, key=lambda r: int(r["uid"].rsplit("_", 1)[1])) for key, outputs in found.items()}


def test_the_anchor_counts_trajectories_and_every_output_gets_its_trajectorys_advantage(agentic_runs):
    differed = False
    for metrics in agentic_runs["metrics"]:
        rows = dump(agentic_runs["rollouts"] / f"{metrics['step']}.jsonl")
        by_trajectory = trajectories(rows)
        outputs = [len(o) for o in by_trajectory.values()]
        # 4 prompts x 4 sessions; odd sessions return two outputs, even ones one.
        assert len(by_trajectory) == 16 and sum(outputs) == 24 and sorted(set(outputs)) == [1, 2]
        assert metrics["multi_output/trajectories"] == 16
        assert metrics["multi_output/outputs_per_trajectory_mean"] == pytest.approx(1.5)
        finals = {key: o[-1] for key, o in by_trajectory.items()}
        trajectory_share = np.mean([r["score"] for r in finals.values()])
        row_share = np.mean([r["score"] for o in by_trajectory.values() for r in o])
        assert metrics["apo/batch_success"] == pytest.approx(trajectory_share, abs=1e-12)
        differed |= trajectory_share != row_share
        # Group-centered final outcomes over each prompt's trajectories, times Phi_i, on every output.
        prompts: dict[str, list[str]] = {}
        for key in finals:
            prompts.setdefault(key.rsplit("_", 1)[0], []).append(key)
        for keys in prompts.values():
            mean = np.mean([finals[k]["score"] for k in keys])
            for key in keys:
                final = finals[key]
                for row in by_trajectory[key]:
                    assert row["apo_anchor"] == pytest.approx(metrics["apo/anchor"], rel=1e-9)
                    # The dump's advantage is each row's token mean of one broadcast value: equal to rounding.
                    assert row["advantage"] == pytest.approx(final["advantage"], rel=1e-9, abs=1e-12)
                    assert row["apo_phi"] == final["apo_phi"]
                assert final["advantage"] == pytest.approx(final["apo_phi"] * (final["score"] - mean), abs=1e-6)
    assert differed, "no step had a trajectory share unlike the row share: nothing told the two rules apart"


def test_the_recipes_trainer_for_colocate_async_ran(agentic_runs):
    log = agentic_runs["log"].read_text()
    assert "trainer: apo_colocate_async (verl's colocate_async with the recipe's hooks)" in log
    assert [row["step"] for row in agentic_runs["metrics"]] == [1, 2, 3, 4]


def test_staleness_and_partial_rollouts_are_in_the_dump_as_verl_measures_them(agentic_runs):
    lagged = spanned = False
    for metrics in agentic_runs["metrics"]:
        step_rows = dump(agentic_runs["rollouts"] / f"{metrics['step']}.jsonl")
        rows = [r for r in step_rows if not r["uid"].startswith("pad")]
        lags = [r["policy_lag"] for r in rows]
        worst = [r["policy_lag_worst"] for r in rows]
        # verl's own step metrics over the same rows (its lower bound and its worst case).
        assert max(lags) == metrics["training/off_policy/trajectory_staleness/max"]
        assert min(lags) == metrics["training/off_policy/trajectory_staleness/min"]
        assert max(worst) == metrics["training/off_policy/trajectory_staleness_worst/max"]
        assert all(w >= lag >= 0 for w, lag in zip(worst, lags))
        lagged |= max(lags) > 0
        spanned |= metrics["training/off_policy/trajectory_spans/max"] > 1
    # The warm-up batch is trained a step late; an aborted request resumed after an update spans two versions.
    assert lagged and spanned


def test_every_checkpoint_holds_the_anchor_of_its_step(agentic_runs):
    assert_each_checkpoint_holds_its_steps_anchor(agentic_runs["metrics"], agentic_runs["ckpt"])
