"""Multi-output trajectories through the recipe's trainer, one level below the whole loop: verl's own V1 advantage
step on rows held in TransferQueue under verl's keys ``{uid}_{session}_{index}``, with hand-worked values.

The batch: three prompts of two trajectories each, with different numbers of outputs (equal counts would leave
every mean unchanged and hide the rule). verl copies a trajectory's final reward to its earlier outputs; so does
the batch. Outcomes by trajectory (outputs in brackets):

    a (easy): a0 = 1 [3 outputs], a1 = 0 [1]      b (hard): b0 = 1 [1], b1 = 0 [2]      c (hard): 0 [2], 0 [1]

Trajectory success share 2/6 = 1/3; output-row share 4/10. Groups a and b are half right, c is dead.
"""

import math

import numpy as np
import pytest
import torch
import transfer_queue as tq
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorStack
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from recipe_apo.integration.multi_output import Sessions
from recipe_apo.integration.rollout_dump import DumpFieldsError
from recipe_apo.methods.apo.anchor import driver_anchors, reset_driver_anchors
from recipe_apo.methods.driver_state import handed

# key: (reward, response length, old token log-prob). verl's completion order: a trajectory's rows are apart.
ROWS = {
    "a_0_0": (1.0, 2, -3.0), "b_1_0": (0.0, 1, -3.0), "a_1_0": (0.0, 4, -0.4), "c_0_0": (0.0, 2, -3.0),
    "a_0_1": (1.0, 3, -3.0), "b_0_0": (1.0, 2, -0.5), "c_1_0": (0.0, 1, -0.1), "a_0_2": (1.0, 1, -0.2),
    "b_1_1": (0.0, 3, -0.7), "c_0_1": (0.0, 2, -0.1),
}
SOURCES = {"a": "easy", "b": "hard", "c": "hard", "s": "easy", "t": "hard", "p": "easy"}
TRAJECTORY_OF = {key: key.rsplit("_", 1)[0] for key in ROWS}


def put_rows(prefix, rows=ROWS):
    """The rows in TransferQueue under ``{prefix}{key}`` (a fresh prompt uid per test); the batch handle."""
    keys = [f"{prefix}{key}" for key in rows]
    values = list(rows.values())

    def nested(tensors):
        return torch.nested.nested_tensor(tensors, layout=torch.jagged)

    scores = []
    for reward, length, _ in values:
        row = torch.zeros(length)
        row[-1] = reward
        scores.append(row)
    fields = TensorDict({
        "uid": NonTensorStack(*[prefix + key.split("_")[0] for key in rows]),
        "data_source": NonTensorStack(*[SOURCES[key[0]] for key in rows]),
        # verl's padding rows (padding_utils.py): one response token, masked.
        "response_mask": nested([torch.full((length,), int(not key.startswith("pad")), dtype=torch.int64)
                                 for key, (_, length, _) in rows.items()]),
        "rm_scores": nested(scores),
        "old_log_probs": nested([torch.full((length,), lp) for _, length, lp in values]),
    }, batch_size=len(keys))
    return tq.kv_batch_put(keys=keys, partition_id="train", fields=fields)


def advantages_by_key(batch):
    """Each row's advantage on its tokens (checked equal on every token) by the key without its prefix."""
    got = tq.kv_batch_get(keys=batch.keys, partition_id="train", select_fields=["advantages", "response_mask"])
    advantages, mask = got["advantages"].to_padded_tensor(0.0), got["response_mask"].to_padded_tensor(0)
    values = {}
    for row, key in enumerate(batch.keys):
        length = int(mask[row].sum())
        assert torch.equal(advantages[row, :length], advantages[row, :1].expand(length)), key
        assert not advantages[row, length:].any()
        values[key.split("-", 1)[1]] = float(advantages[row, 0])
    return values


def handle(keys):
    """A batch handle for ``keys`` (as verl's trainer builds one for the rows it dumps)."""
    return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id="train")


def by_trajectory(values):
    return {key: values[TRAJECTORY_OF[key]] for key in ROWS}


def test_sessions_follow_verls_keys_final_output_is_the_largest_index():
    sessions = Sessions.of(list(ROWS))
    assert sessions.count == 6 and not sessions.single_output
    assert [list(ROWS)[row] for row in sessions.final_rows] == ["a_0_2", "b_1_1", "a_1_0", "c_0_1", "b_0_0", "c_1_0"]
    assert sessions.broadcast(np.arange(6)).tolist() == [0, 1, 2, 3, 0, 4, 5, 0, 1, 3]
    # verl's padding rows are trajectories of one output; keys not of verl's form are one trajectory each.
    single = Sessions.of(["u_0_0", "u_1_0", "pad1f_0_0", "pad1f_1_0", "step1-0"])
    assert single.single_output and single.final_rows.tolist() == [0, 1, 2, 3, 4]
    assert Sessions.of(["x_1_10", "x_1_9"]).final_rows.tolist() == [0]  # indices compare as numbers


def test_apo_anchor_moves_with_the_share_of_successful_trajectories_and_advantages_broadcast(
        transfer_queue, tmp_path, recipe_config, bare_trainer):
    """C_1 = y_1 (a fresh anchor's warm start) = 2/6, not the output rows' 4/10. p_a = p_b = 1/2, p_c = 0, so
    Delta_a = Delta_b = 1/6 and Delta_c = -1/3; A = +-1/2 on a and b; Phi = exp(-1/6) for the right trajectories,
    exp(1/6) for the wrong ones (lambda_scale 1), 1 on c. Every output of a trajectory gets its advantage."""
    reset_driver_anchors()
    trainer = bare_trainer(recipe_config(tmp_path, "algorithm.apo.lambda_scale=1.0"))
    trainer.global_steps = 1
    metrics = {}
    batch = trainer._compute_advantage(put_rows("apo-"), metrics)

    up, down = 0.5 * math.exp(-1 / 6), -0.5 * math.exp(1 / 6)
    expected = by_trajectory({"a_0": up, "a_1": down, "b_0": up, "b_1": down, "c_0": 0.0, "c_1": 0.0})
    got = advantages_by_key(batch)
    assert got == pytest.approx(expected, rel=1e-6, abs=0)
    assert driver_anchors().anchor().value == pytest.approx(1 / 3, abs=1e-15)
    apo = {k: v for k, v in metrics.items() if k.startswith("apo/")}
    assert apo == pytest.approx({
        "apo/batch_success": 1 / 3, "apo/anchor": 1 / 3, "apo/anchor_rate": 1.0,
        "apo/harder_group_share": 1 / 3, "apo/uniform_group_share": 1 / 3,
        "apo/weight_pos_mean": math.exp(-1 / 6), "apo/weight_neg_mean": math.exp(1 / 6),
    }, abs=1e-12)
    assert {k: v for k, v in metrics.items() if k.startswith("multi_output/")} == {
        "multi_output/trajectories": 6.0, "multi_output/outputs_per_trajectory_mean": 10 / 6,
        "multi_output/outputs_per_trajectory_max": 3.0}

    # The dump: every row its trajectory's Phi_i and C_t, in the dump's own row order.
    phi = by_trajectory({"a_0": math.exp(-1 / 6), "a_1": math.exp(1 / 6), "b_0": math.exp(-1 / 6),
                         "b_1": math.exp(1 / 6), "c_0": 1.0, "c_1": 1.0})
    dumped = trainer.dump_columns.for_rows(batch.keys)
    assert dumped["apo_phi"] == pytest.approx([phi[key.split("-", 1)[1]] for key in batch.keys], rel=1e-12)
    assert dumped["apo_anchor"] == pytest.approx([1 / 3] * len(ROWS), abs=1e-15)
    reverse = handle(batch.keys[::-1])
    assert trainer.dump_columns.for_rows(reverse.keys)["apo_phi"] == dumped["apo_phi"][::-1]
    reset_driver_anchors()


def test_per_source_anchors_take_each_sources_trajectories(transfer_queue, tmp_path, recipe_config, bare_trainer):
    """easy: a0, a1 -> y = 1/2 (rows: 3/4); hard: b0, b1, c0, c1 -> y = 1/4 (rows: 1/6)."""
    reset_driver_anchors()
    trainer = bare_trainer(recipe_config(tmp_path, "algorithm.apo.anchor_scope=data_source"))
    metrics = {}
    trainer._compute_advantage(put_rows("scoped-"), metrics)
    assert metrics["apo/batch_success/easy"] == 0.5 and metrics["apo/anchor/easy"] == 0.5
    assert metrics["apo/batch_success/hard"] == 0.25 and metrics["apo/anchor/hard"] == 0.25
    reset_driver_anchors()


def test_apo_without_reweighting_gives_verls_own_grpo_advantages_on_the_same_rows(
        transfer_queue, tmp_path, recipe_config, bare_trainer):
    """verl's grpo branch (Dr. GRPO: no std) applies the final-output rule itself; APO with reweight=false
    computes the same centered advantages: the recipe's rule and verl's agree row by row."""
    reset_driver_anchors()
    apo = bare_trainer(recipe_config(tmp_path, "algorithm.apo.reweight=false"))
    apo_values = advantages_by_key(apo._compute_advantage(put_rows("plain-"), {}))
    grpo = bare_trainer(recipe_config(tmp_path, method="drgrpo"))
    grpo_values = advantages_by_key(grpo._compute_advantage(put_rows("grpo-"), {}))
    assert apo_values == grpo_values
    assert apo_values == by_trajectory({"a_0": 0.5, "a_1": -0.5, "b_0": 0.5, "b_1": -0.5, "c_0": 0.0, "c_1": 0.0})
    reset_driver_anchors()


def test_codapo_weights_groups_by_trajectories_with_the_final_outputs_log_probs_and_the_zero_variance_scale(
        transfer_queue, tmp_path, recipe_config, bare_trainer):
    """acc_a = acc_b = 1/2 (rows: 3/4, 1/3), acc_c = 0. c_g averages the final outputs' mean token log-probs (the
    earlier outputs' -3.0 never enter): c_a = exp(-0.3), c_b = exp(-0.6), c_c = exp(-0.1). w_g = c_g d_w + 0.1 with
    d_w = 1, 1, 0. A = +-0.5 / (sqrt(0.5) + 1e-6). token-mean's zero-variance scale: T = 21 tokens over all
    outputs, T_live = 16 (groups a and b, every output)."""
    trainer = bare_trainer(recipe_config(tmp_path, "algorithm.zero_variance=exclude", "algorithm.codapo.resample=false",
                                         method="codapo"))
    trainer.global_steps = 1
    metrics = {}
    batch = trainer._compute_advantage(put_rows("codapo-"), metrics)
    w_a, w_b = math.exp(-0.3) + 0.1, math.exp(-0.6) + 0.1
    a = 0.5 / (math.sqrt(0.5) + 1e-6) * 21 / 16
    expected = by_trajectory({"a_0": a * w_a, "a_1": -a * w_a, "b_0": a * w_b, "b_1": -a * w_b, "c_0": 0.0,
                              "c_1": 0.0})
    assert advantages_by_key(batch) == pytest.approx(expected, rel=1e-6, abs=0)
    assert metrics["zero_variance/scale"] == pytest.approx(21 / 16, rel=1e-15)
    assert metrics["zero_variance/live_share"] == pytest.approx(16 / 21, rel=1e-15)
    assert {k: v for k, v in metrics.items() if k.startswith("codapo/")} == pytest.approx({
        "codapo/weight_mean": (w_a + w_b + 0.1) / 3, "codapo/accuracy_mean": 1 / 3,
        "codapo/difficulty_weight_mean": 2 / 3,
        "codapo/confidence_mean": (math.exp(-0.3) + math.exp(-0.6) + math.exp(-0.1)) / 3,
    }, rel=1e-6)
    weight = by_trajectory({"a_0": w_a, "a_1": w_a, "b_0": w_b, "b_1": w_b, "c_0": 0.1, "c_1": 0.1})
    dumped = trainer.dump_columns.for_rows(batch.keys)["codapo_weight"]
    assert dumped == pytest.approx([weight[key.split("-", 1)[1]] for key in batch.keys], rel=1e-6)


@pytest.mark.parametrize("padding", [0, 2])
def test_apo_zero_variance_counts_every_output_row_in_the_sequence_denominator(
        transfer_queue, tmp_path, recipe_config, bare_trainer, padding):
    """seq-mean-token-sum-norm: verl's denominator counts rows, so B = 10 output rows and the dead group c's 3 rows
    leave it: 10 / 7. verl pads a multi-output step to whole mini-batches with rows of no valid token
    (``pad<hex>_{i}_0``), which its global_batch_size counts: with 2 of them, 12 / 9. The anchor ignores them."""
    rows = {**ROWS, **{f"pad9f_{i}_0": (0.0, 1, 0.0) for i in range(padding)}}
    reset_driver_anchors()
    trainer = bare_trainer(recipe_config(tmp_path, "algorithm.zero_variance=exclude", "algorithm.apo.lambda_scale=1.0"))
    metrics = {}
    batch = put_rows(f"zv{padding}-", rows)
    # verl tags its padding rows (padding_utils.py): they are no trajectories of the step.
    batch.tags = [{"is_padding": key.startswith(f"zv{padding}-pad")} for key in batch.keys]
    got = advantages_by_key(trainer._compute_advantage(batch, metrics))
    assert metrics["multi_output/trajectories"] == 6.0 and metrics["multi_output/outputs_per_trajectory_mean"] == 10 / 6
    scale = (10 + padding) / (7 + padding)
    assert metrics["zero_variance/scale"] == pytest.approx(scale, rel=1e-15)
    assert metrics["zero_variance/live_share"] == pytest.approx(7 / 10, rel=1e-15)
    assert metrics["apo/batch_success"] == pytest.approx(1 / 3, abs=1e-15)
    up, down = 0.5 * math.exp(-1 / 6) * scale, -0.5 * math.exp(1 / 6) * scale
    expected = by_trajectory({"a_0": up, "a_1": down, "b_0": up, "b_1": down, "c_0": 0.0, "c_1": 0.0})
    assert got == pytest.approx({**expected, **{f"pad9f_{i}_0": 0.0 for i in range(padding)}}, rel=1e-6, abs=0)
    reset_driver_anchors()


def test_only_the_final_outputs_reward_decides_even_when_earlier_outputs_were_scored_apart(
        transfer_queue, tmp_path, recipe_config, bare_trainer):
    """A reward model colocated with the trainer scores every row apart (verl's ``_compute_reward_colocate``):
    earlier outputs of a then score 0 and c's first output 1. The outcomes are still the final outputs': the same
    advantages as above, and c stays dead for the zero-variance scale."""
    rows = dict(ROWS)
    rows["a_0_0"], rows["a_0_1"], rows["c_0_0"] = (0.0, 2, -3.0), (0.0, 3, -3.0), (1.0, 2, -3.0)
    reset_driver_anchors()
    trainer = bare_trainer(recipe_config(tmp_path, "algorithm.zero_variance=exclude", "algorithm.apo.lambda_scale=1.0"))
    metrics = {}
    got = advantages_by_key(trainer._compute_advantage(put_rows("scored-", rows), metrics))
    up, down = 0.5 * math.exp(-1 / 6) * 10 / 7, -0.5 * math.exp(1 / 6) * 10 / 7
    assert got == pytest.approx(by_trajectory({"a_0": up, "a_1": down, "b_0": up, "b_1": down, "c_0": 0.0,
                                               "c_1": 0.0}), rel=1e-6, abs=0)
    assert metrics["apo/batch_success"] == pytest.approx(1 / 3, abs=1e-15)
    reset_driver_anchors()


SINGLE = {f"{uid}_{session}_0": (float(uid == "s" and session == 0), 2 + session, -0.1 * (session + 1))
          for uid in ("s", "t") for session in range(2)}


@pytest.mark.parametrize("method", ["apo", "codapo"])
def test_single_output_batches_get_verls_own_advantages_bit_for_bit(transfer_queue, tmp_path, recipe_config,
                                                                    bare_trainer, method):
    """One output per trajectory (verl's single_turn and tool agent loops): the recipe's advantage step is
    verl's own, to the bit, and logs no multi_output metric."""
    overrides = ["algorithm.codapo.resample=false"] if method == "codapo" else []
    trainer = bare_trainer(recipe_config(tmp_path, *overrides, method=method))
    reset_driver_anchors()
    metrics = {}
    ours = trainer._compute_advantage(put_rows(f"ours{method}-", SINGLE), metrics)
    assert not any(key.startswith("multi_output/") for key in metrics)
    reset_driver_anchors()
    theirs = put_rows(f"verl{method}-", SINGLE)
    log_probs = tq.kv_batch_get(keys=theirs.keys, partition_id="train", select_fields=["old_log_probs"])
    with handed(old_log_probs=log_probs["old_log_probs"].to_padded_tensor(0.0)):
        PPOTrainerSync._compute_advantage(trainer, theirs, {})
    ours_adv = tq.kv_batch_get(keys=ours.keys, partition_id="train", select_fields=["advantages"])["advantages"]
    theirs_adv = tq.kv_batch_get(keys=theirs.keys, partition_id="train", select_fields=["advantages"])["advantages"]
    assert torch.equal(ours_adv.to_padded_tensor(0.0), theirs_adv.to_padded_tensor(0.0))
    assert ours_adv.to_padded_tensor(0.0).abs().sum() > 0  # a live group: the comparison can fail
    reset_driver_anchors()


def test_a_dump_of_rows_the_advantage_step_did_not_see_is_refused_not_silently_left_out(
        transfer_queue, tmp_path, recipe_config, bare_trainer, capsys):
    """Two advantage steps in one training step (``trainer.v1.sync.parameter_sync_step=2``) are dumped together;
    rows from no advantage step of the step raise, and the trainer's dump names the methods' columns as missing and
    keeps the audit's."""
    reset_driver_anchors()
    trainer = bare_trainer(recipe_config(tmp_path))
    trainer.global_steps = 3
    first = trainer._compute_advantage(put_rows("sync1-"), {})
    second = trainer._compute_advantage(put_rows("sync2-", SINGLE), {})
    together = handle(second.keys + first.keys)
    dumped = trainer.dump_columns.for_rows(together.keys)["apo_phi"]
    assert len(dumped) == len(ROWS) + len(SINGLE)
    assert dumped[len(SINGLE):] == trainer.dump_columns.for_rows(first.keys)["apo_phi"]
    stray = handle(first.keys + ["other_0_0"])
    with pytest.raises(DumpFieldsError, match=r"apo_phi, apo_anchor: 1 of 11 dumped rows .* 'other_0_0'"):
        trainer.dump_columns.for_rows(stray.keys)

    trainer.audit_fields = lambda batch: {"other": [0.0] * len(batch.keys)}
    assert list(trainer._dump_fields(stray)) == ["other"]
    trainer._dump_fields(stray)
    assert capsys.readouterr().out.count("rollout dump without the methods' fields (DumpFieldsError") == 1
    # A new training step starts afresh: the earlier step's values are not dumped for it.
    trainer.dump_columns.add(4, [], {})
    assert trainer.dump_columns.for_rows(first.keys) == {}
    reset_driver_anchors()


def test_the_launch_warns_that_verls_own_trainer_gives_apo_every_output_of_a_custom_agent_loop(tmp_path, recipe_config):
    from recipe_apo.integration.validation import config_warnings

    def said(*overrides):
        return [w for w in config_warnings(recipe_config(tmp_path, *overrides)) if "final-output rule" in w]

    custom = "actor_rollout_ref.rollout.agent.default_agent_loop=my_loop"
    (warning,) = said("trainer.v1.trainer_mode=sync", custom)
    assert warning.startswith("algorithm.adv_estimator=apo with trainer.v1.trainer_mode=sync and agent loop my_loop: ")
    assert said("trainer.v1.trainer_mode=sync", "actor_rollout_ref.rollout.agent.agent_loop_config_path=/a.yaml")
    assert said(custom) == []  # the recipe's trainer (apo_sync, its default) applies the rule
    assert said("trainer.v1.trainer_mode=sync") == []  # verl's single_turn_agent: one output per trajectory
