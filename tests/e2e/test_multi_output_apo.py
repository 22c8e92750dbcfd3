"""method=apo with a multi-output agent loop in the real loop: the rehearsal's two-turn loop returns two outputs
for odd sessions and one for even ones (recipe_apo/cpu/agent_loops.py), so a prompt's trajectories have different
numbers of output rows. The recipe's trainer gives APO verl's final-output rule: one response per trajectory (its
final output), the anchor's batch success the share of successful trajectories, every output of a trajectory its
advantage."""

from __future__ import annotations

import numpy as np
import pytest
from rehearsal_runs import checkpoint_root, dump, run, tail

from recipe_apo.cpu import agent_loops, rehearse

# The tiny model, warmed up on single-turn prompts, almost never answers its second turn right: a reward on the
# last turn's text length gives both outcomes, so that groups carry a signal.
EVEN_LENGTH_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(len(solution_str.rsplit("assistant\\n", 1)[-1].strip()) % 2 == 0)
'''
STEPS = 3
LOOP_ARGS = (f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops.CONFIG_PATH}",
             "actor_rollout_ref.rollout.agent.default_agent_loop=recipe_two_turn_alternate",
             "data.max_response_length=48",  # two turns and the user turn; a later override wins over 16
             "actor_rollout_ref.rollout.full_determinism=true", "trainer.val_before_train=false",
             "trainer.save_freq=-1", f"trainer.total_training_steps={STEPS}")


@pytest.fixture(scope="module")
def multi_output_run(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("multi_output")
    reward = workdir / "even_length.py"
    reward.write_text(EVEN_LENGTH_REWARD)
    result = run(rehearse.recipe_command(["apo"], {**tiny, "reward": reward}, *LOOP_ARGS), workdir, "apo",
                 workdir / "metrics")
    assert result.returncode == 0, tail(result)
    experiment = rehearse.experiment_names(result.log)[0]
    return {"metrics": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics", experiment)),
            "rollouts": checkpoint_root(workdir, experiment) / "rollouts"}


def trajectories(rows: list[dict]) -> dict[str, list[dict]]:
    """verl's rows ``{uid}_{session}_{index}`` (padding rows left out) by trajectory, in output order."""
    found: dict[str, list[dict]] = {}
    for row in rows:
        if not row["uid"].startswith("pad"):
            found.setdefault(row["uid"].rsplit("_", 1)[0], []).append(row)
    return {key: sorted(outputs, key=lambda r: int(r["uid"].rsplit("_", 1)[1])) for key, outputs in found.items()}


def test_the_anchor_counts_trajectories_and_every_output_gets_its_trajectorys_advantage(multi_output_run):
    differed = False
    for metrics in multi_output_run["metrics"]:
        rows = dump(multi_output_run["rollouts"] / f"{metrics['step']}.jsonl")
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
