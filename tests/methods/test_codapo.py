"""CoDaPO: the estimator on a batch worked by hand, against CoDaPO's own per-response loop (re-written here as
its code reads, tmlr-group/CoDaPO 210c205), the prompt selection and the resampled batch, the driver hand-off."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe_apo.errors import RecipeError
from recipe_apo.methods.codapo.estimator import (
    codapo_outcome_advantage,
    compute_codapo_advantage,
    resample_order,
    select_prompts,
)
from recipe_apo.methods.codapo.runtime import ResamplingStateError, StepPairing, first_of_pair
from recipe_apo.methods.codapo.settings import MAX_REPEAT_COUNT, MAX_WEIGHT_OFFSET, CodapoConfigError, CodapoSettings
from recipe_apo.methods.driver_state import handed, handed_log_probs, last_result
from recipe_apo.methods.errors import BatchInputError

LN2 = math.log(2.0)


def hand_batch():
    """Group a: 1 of 4 right, every token log-prob -ln 2. Group b: 2 of 2 right. Group c: 1 of 2 right, mean
    token log-probs -2 and -0.5. One padding row (no valid token)."""
    rewards = torch.zeros(9, 3)
    mask = torch.zeros(9, 3)
    log_probs = torch.zeros(9, 3)
    lengths = [2, 1, 3, 2, 1, 2, 2, 1, 0]
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    for row, reward in enumerate([1, 0, 0, 0, 1, 1, 1, 0]):
        rewards[row, lengths[row] - 1] = reward
    log_probs[:4] = -LN2
    log_probs[4:6] = -0.1
    log_probs[6, :2] = torch.tensor([-1.0, -3.0])
    log_probs[7, 0] = -0.5
    log_probs[6, 2] = log_probs[7, 1:] = -50.0  # padding positions: must not count
    uid = np.array(["a"] * 4 + ["b"] * 2 + ["c"] * 2 + ["pad"], dtype=object)
    return rewards, mask, log_probs, uid


def test_codapo_advantages_on_a_batch_worked_by_hand():
    rewards, mask, log_probs, uid = hand_batch()
    advantages, weights, metrics = compute_codapo_advantage(rewards, mask, log_probs, uid)
    # a: acc 1/4, d_w = 4 (1/4)(3/4) = 0.75, c = exp(-ln 2) = 0.5, w = 0.5 * 0.75 + 0.1 = 0.475;
    #    mean 0.25, sample std 0.5: A = 0.75 / (0.5 + 1e-6) for the right one, -0.25 / (0.5 + 1e-6) for the others.
    # b: acc 1, d_w 0, w = 0.1; std 0: A = 0.
    # c: acc 1/2, d_w 1, c = exp((-2 - 0.5) / 2) = exp(-1.25); A = +-0.5 / (sqrt(0.5) + 1e-6).
    w_c = math.exp(-1.25) + 0.1
    expected_w = [0.475] * 4 + [0.1] * 2 + [w_c] * 2 + [0.0]
    np.testing.assert_allclose(weights, expected_w, rtol=1e-7)  # the log-probs are float32, as verl's
    s = 0.5 + 1e-6
    c = math.sqrt(0.5) + 1e-6
    scalar = [0.75 / s * 0.475] + [-0.25 / s * 0.475] * 3 + [0.0, 0.0] + [0.5 / c * w_c, -0.5 / c * w_c] + [0.0]
    expected = torch.tensor(scalar, dtype=torch.float64).unsqueeze(-1) * mask.double()
    torch.testing.assert_close(advantages.double(), expected, rtol=1e-6, atol=1e-7)
    assert advantages.dtype == torch.float32
    assert metrics["codapo/weight_mean"] == pytest.approx((0.475 + 0.1 + w_c) / 3)
    assert metrics["codapo/difficulty_weight_mean"] == pytest.approx((0.75 + 0 + 1) / 3)


def test_without_std_the_advantages_are_only_centered_and_accuracy_counts_exact_ones():
    rewards = torch.tensor([[0.99], [0.0], [1.0], [0.0]])
    mask = torch.ones(4, 1)
    log_probs = torch.zeros(4, 1)  # c = 1
    advantages, weights, _ = compute_codapo_advantage(rewards, mask, log_probs, np.array([0, 0, 1, 1]), False)
    # Group 0: 0.99 is not a success (CoDaPO compares with == 1.0): acc 0, w = 0.1. Group 1: acc 1/2, w = 1.1.
    np.testing.assert_allclose(weights, [0.1, 0.1, 1.1, 1.1])
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.495 * 0.1, -0.495 * 0.1, 0.55, -0.55]))


def codapo_reference(rewards, mask, log_probs, index, norm, offset=0.1, eps=1e-6):
    """CoDaPO's compute_codapo_advantage as its code reads (per-response Python loops, torch.std)."""
    scores = rewards.sum(dim=-1)
    id2score, id2rows = defaultdict(list), defaultdict(list)
    response_lp = {}
    for i in range(len(scores)):
        count = mask[i].sum().item()
        response_lp[i] = (log_probs[i] * mask[i]).sum().item() / count if count > 0 else 0.0
        id2score[index[i]].append(scores[i])
        id2rows[index[i]].append(i)
    out, weights = scores.clone().double(), torch.zeros(len(scores), dtype=torch.float64)
    for uid, group in id2score.items():
        values = torch.stack(group).double()
        mean, std = (values.mean(), values.std()) if len(group) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        acc = (values == 1.0).double().mean().item()
        c = math.exp(sum(response_lp[i] for i in id2rows[uid]) / len(id2rows[uid]))
        w = c * (1 - 4 * ((1 - acc) - 0.5) ** 2) + offset
        for i in id2rows[uid]:
            centered = (out[i] - mean) / (std + eps) if norm else out[i] - mean
            out[i] = centered * w
            weights[i] = w
    return out.unsqueeze(-1) * mask.double(), weights


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    data=st.data(),
    norm=st.booleans(),
)
def test_the_vectorized_estimator_equals_codapos_own_loop(groups, data, norm):
    sizes = groups
    n, width = sum(sizes), 4
    index = np.repeat(np.arange(len(sizes)), sizes).astype(object)
    lengths = data.draw(st.lists(st.integers(1, width), min_size=n, max_size=n))
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    picks = data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=n, max_size=n))
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), torch.tensor(lengths) - 1] = torch.tensor(picks)
    log_probs = -torch.tensor(data.draw(st.lists(st.floats(0.0, 5.0), min_size=n * width, max_size=n * width)))
    log_probs = log_probs.view(n, width)
    advantages, weights, _ = compute_codapo_advantage(rewards, mask, log_probs, index, norm)
    expected, expected_w = codapo_reference(rewards, mask, log_probs, index, norm)
    torch.testing.assert_close(advantages.double(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights, expected_w.numpy(), rtol=1e-6)


def test_the_estimator_refuses_plain_verl_and_bad_batches():
    rewards, mask, log_probs, uid = hand_batch()
    with pytest.raises(BatchInputError, match="python -m recipe_apo.main"):
        codapo_outcome_advantage(rewards, mask, config={"norm_adv_by_std_in_grpo": True}, index=uid)
    with pytest.raises(BatchInputError, match="old_log_probs"):
        compute_codapo_advantage(rewards, mask, log_probs[:, :2], uid)
    log_probs[0, 0] = float("nan")
    with pytest.raises(BatchInputError, match="first rows \\[0\\]"):
        compute_codapo_advantage(rewards, mask, log_probs, uid)


def test_the_handed_log_probs_reach_the_registered_estimator_and_its_weights_stay_on_the_book():
    from verl.trainer.ppo import core_algos

    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators and losses)

    rewards, mask, log_probs, uid = hand_batch()
    fn = core_algos.get_adv_estimator_fn("codapo")
    with handed(old_log_probs=log_probs):
        advantages, returns = fn(token_level_rewards=rewards, response_mask=mask,
                                 config={"norm_adv_by_std_in_grpo": True, "codapo": {"weight_offset": 0.0}}, index=uid)
    assert handed_log_probs() is None  # handed for one call only
    assert advantages is returns
    # weight_offset read from the config
    np.testing.assert_allclose(last_result("codapo").per_response["weights"][4:6], [0.0, 0.0])
    assert last_result("codapo").per_response["uids"].tolist() == uid.tolist()


def test_settings_refuse_bad_values_naming_the_key():
    assert CodapoSettings.from_algorithm_config(None) == CodapoSettings()
    for node, key in [({"percentile": 1.0}, "percentile"), ({"repeat_count": 2.5}, "repeat_count"),
                      ({"weight_offset": -0.1}, "weight_offset"), ({"resample": "yes"}, "resample"),
                      ({"percentil": 0.5}, "percentil")]:
        with pytest.raises(CodapoConfigError, match=f"algorithm.codapo.{key}"):
            CodapoSettings.from_algorithm_config({"codapo": node})


def test_selection_keeps_the_prompts_at_or_above_the_linear_quantile():
    prompts = np.array(["p0", "p1", "p2", "p3", "p4"], dtype=object)
    # One weight per group; p4 got no response back.
    uids = np.array(["p0", "p0", "p1", "p2", "p2", "p3"], dtype=object)
    weights = np.array([0.5, 0.5, 0.1, 0.9, 0.9, 0.3])
    # torch.quantile([0.5, 0.1, 0.9, 0.3], 0.75): sorted 0.1 0.3 0.5 0.9, position 2.25 -> 0.5 + 0.25 * 0.4 = 0.6.
    assert select_prompts(prompts, uids, weights, 0.75).tolist() == [2]
    # At 0.5: 0.3 + 0.5 * 0.2 = 0.4 -> p0 and p2, in prompt order.
    assert select_prompts(prompts, uids, weights, 0.5).tolist() == [0, 2]
    # Ties at the threshold are all kept: three dead groups at the 0.1 floor.
    tied = np.array([0.1, 0.1, 0.1, 0.7])
    assert select_prompts(prompts[:4], prompts[:4], tied, 0.5).tolist() == [0, 1, 2, 3]


def test_the_second_batch_repeats_each_kept_prompt_in_place_and_wraps():
    assert resample_order(np.array([3, 7]), 8, 4).tolist() == [3, 3, 3, 3, 7, 7, 7, 7]
    assert resample_order(np.array([3, 7]), 6, 4).tolist() == [3, 3, 3, 3, 7, 7]
    # CoDaPO's loop: 3 kept prompts fill 16 slots as a x 8, b x 4, c x 4.
    assert np.bincount(resample_order(np.array([0, 1, 2]), 16, 4)).tolist() == [8, 4, 4]
    with pytest.raises(BatchInputError, match="no prompt kept"):
        resample_order(np.array([], dtype=np.int64), 4, 4)


def test_the_step_pairing_keeps_and_repeats_positions_for_the_step_after_only():
    pairing = StepPairing(CodapoSettings(repeat_count=2))
    assert first_of_pair(1) and not first_of_pair(2)
    pairing.start(step=1)
    with pytest.raises(ResamplingStateError, match="no weighted step"):
        pairing.second_order(4, step=2)
    pairing.add_weights(np.array(["a", "a", "b", "b", "c", "c"], dtype=object), np.repeat([0.9, 0.1, 0.9], 2))
    assert pairing.select(["a", "b", "c"]).tolist() == [0, 2]  # a and c reach the 0.75 quantile, 0.9
    pairing.add_weights(np.array(["b"], dtype=object), np.array([5.0]))  # selected: later weights change nothing
    assert pairing.select(None).tolist() == [0, 2]
    assert pairing.second_order(6, step=2).tolist() == [0, 0, 1, 1, 0, 0]  # positions among the kept prompts
    with pytest.raises(ResamplingStateError, match="step 4 needs the prompts kept at step 3"):
        pairing.second_order(6, step=4)
    pairing.restore(3, step=5)  # a checkpoint's three kept prompts
    assert pairing.second_order(4, step=6).tolist() == [0, 0, 1, 1]


# ---- hostile inputs: overflow, broken log-probs, huge repeat counts, quoted booleans ----------------
def test_settings_that_could_overflow_or_exhaust_memory_are_refused_naming_the_key():
    for node, message in [
        ({"weight_offset": 1e39}, f"algorithm.codapo.weight_offset must be <= {MAX_WEIGHT_OFFSET}, got 1e+39"),
        ({"weight_offset": float("inf")}, "algorithm.codapo.weight_offset must be a finite number, got inf"),
        ({"repeat_count": 1_000_000_000_000},
         f"algorithm.codapo.repeat_count must be an integer in [1, {MAX_REPEAT_COUNT}], got 1000000000000"),
        ({"percentile": float("nan")}, "algorithm.codapo.percentile must be a finite number, got nan"),
        ({"resample": "false"},
         "algorithm.codapo.resample must be true or false, got 'false' (a string: drop the quotes)"),
    ]:
        with pytest.raises(CodapoConfigError) as info:
            CodapoSettings.from_algorithm_config({"codapo": node})
        assert str(info.value) == message
    # The bounds themselves are accepted.
    CodapoSettings(weight_offset=MAX_WEIGHT_OFFSET, repeat_count=MAX_REPEAT_COUNT)


def test_an_advantage_that_would_overflow_is_refused_naming_the_cause():
    # One group of two: rewards +-3e38 (finite in float32), neither 1.0, so acc 0, d_w 0 and w = weight_offset = 2:
    # A = +-3e38 without std, A * w = +-6e38, past float32's 3.4e38. Today's code returned [inf, -inf].
    rewards = torch.tensor([[3e38], [-3e38]])
    mask, log_probs = torch.ones(2, 1), torch.zeros(2, 1)
    with pytest.raises(BatchInputError) as info:
        compute_codapo_advantage(rewards, mask, log_probs, np.array(["a", "a"]), False, weight_offset=2.0)
    message = str(info.value)
    assert message.startswith("codapo: advantages would overflow float32 (max 3.4e+38): response 0's")
    assert "x w_g 2" in message and "algorithm.codapo.weight_offset=2" in message and "\n" not in message
    # Half the offset fits: exactly +-3e38 (float32 rounding of 3e38 * 1.0).
    advantages, _, _ = compute_codapo_advantage(rewards, mask, log_probs, np.array(["a", "a"]), False, 1.0)
    assert advantages[:, 0].tolist() == [rewards[0, 0].item(), rewards[1, 0].item()]


finite_float32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=80, deadline=None)
@given(
    rewards=st.lists(finite_float32, min_size=1, max_size=8),
    offset=st.floats(0.0, MAX_WEIGHT_OFFSET),
    norm=st.booleans(),
    log_prob=st.floats(-1e30, 0.0),
)
def test_accepted_settings_on_finite_inputs_give_finite_advantages_or_a_clear_error(rewards, offset, norm, log_prob):
    """Every setting the checks accept, any finite float32 rewards and any old log-probs <= 0: the advantages are
    finite, or the batch is refused with one line; never inf or NaN."""
    n = len(rewards)
    token_rewards = torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1)
    index = np.array([i % 2 for i in range(n)], dtype=object)
    settings_ = CodapoSettings(weight_offset=offset)
    try:
        advantages, weights, _ = compute_codapo_advantage(token_rewards, torch.ones(n, 1), torch.full((n, 1), log_prob),
                                                          index, norm, settings_.weight_offset)
    except BatchInputError as exc:
        assert "would overflow" in str(exc) and "\n" not in str(exc)
        return
    assert torch.isfinite(advantages).all() and np.isfinite(weights).all()


@settings(max_examples=60, deadline=None)
@given(
    rewards=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8),
    offset=st.floats(0.0, MAX_WEIGHT_OFFSET),
    norm=st.booleans(),
    log_probs=st.lists(st.floats(-50.0, 0.0), min_size=8, max_size=8),
)
def test_rewards_of_a_usual_range_always_give_finite_advantages(rewards, offset, norm, log_probs):
    n = len(rewards)
    token_rewards = torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1)
    old_log_probs = torch.tensor(log_probs[:n]).unsqueeze(-1)
    advantages, _, _ = compute_codapo_advantage(token_rewards, torch.ones(n, 1), old_log_probs,
                                                np.zeros(n, dtype=object), norm, offset)
    assert torch.isfinite(advantages).all()


def test_positive_old_log_probs_are_refused_naming_the_field_and_rows():
    rewards, mask, log_probs, uid = hand_batch()
    log_probs[0, 1] = 100.0  # a valid token of row 0
    log_probs[3, 0] = 800.0
    with pytest.raises(BatchInputError) as info:
        compute_codapo_advantage(rewards, mask, log_probs, uid)
    assert str(info.value) == (
        "old_log_probs: 2 of 9 responses have a token log-prob above 0 (largest 800; a log-probability is <= 0), "
        "first rows [0, 3]: the old policy's log-probs are broken (rollout or actor)"
    )
    # On padding positions anything goes: row 6's third position is padding.
    rewards, mask, log_probs, uid = hand_batch()
    log_probs[6, 2] = 800.0
    compute_codapo_advantage(rewards, mask, log_probs, uid)
    # Rounding of a log-softmax near 0 stays within the tolerance: c_g = exp(1e-6) is still a confidence.
    log_probs[:4] = 1e-6
    _, weights, _ = compute_codapo_advantage(rewards, mask, log_probs, uid)
    assert weights[0] == pytest.approx(math.exp(1e-6) * 0.75 + 0.1)


def test_a_refused_batch_leaves_the_book_as_the_last_good_batch_left_it():
    rewards, mask, log_probs, uid = hand_batch()
    config = {"norm_adv_by_std_in_grpo": True}
    with handed(old_log_probs=log_probs):
        codapo_outcome_advantage(rewards, mask, config=config, index=uid)
    book = last_result("codapo")
    before = (book.per_response["uids"].copy(), book.per_response["weights"].copy(), dict(book.metrics))
    broken = log_probs.clone()
    broken[2, 0] = 800.0
    for bad_log_probs, bad_config in [(broken, config), (log_probs, {"norm_adv_by_std_in_grpo": "false"}),
                                      (log_probs, {**config, "codapo": {"weight_offset": 1e39}})]:
        with handed(old_log_probs=bad_log_probs), pytest.raises(RecipeError):
            codapo_outcome_advantage(rewards, mask, config=bad_config, index=uid)
        after = last_result("codapo")
        assert after.per_response["uids"].tolist() == before[0].tolist()
        np.testing.assert_array_equal(after.per_response["weights"], before[1])
        assert after.metrics == before[2]


def test_a_quoted_boolean_is_refused_by_the_estimator_itself():
    """Plain verl hands the estimator its algorithm node as is: 'false' is a non-empty string, read as true."""
    rewards, mask, log_probs, uid = hand_batch()
    for value in ("false", "true", 0, None):
        with handed(old_log_probs=log_probs), pytest.raises(RecipeError) as info:
            codapo_outcome_advantage(rewards, mask, config={"norm_adv_by_std_in_grpo": value}, index=uid)
        assert str(info.value) == f"algorithm.norm_adv_by_std_in_grpo must be true or false, got {value!r}" + (
            " (a string: drop the quotes)" if isinstance(value, str) else "")


def naive_resample_order(kept, batch_size, repeat_count):
    """CoDaPO's loop as its code reads: append each kept prompt repeat_count times, in turn, until full; cut."""
    order = []
    position = 0
    while len(order) < batch_size:
        for _ in range(repeat_count):
            if len(order) < batch_size:
                order.append(kept[position])
        position = (position + 1) % len(kept)
    return order


@settings(max_examples=150, deadline=None)
@given(kept=st.lists(st.integers(0, 50), min_size=1, max_size=6), batch_size=st.integers(0, 40),
       repeat_count=st.integers(1, 12))
def test_the_resampled_order_is_codapos_loop(kept, batch_size, repeat_count):
    assert resample_order(np.array(kept), batch_size, repeat_count).tolist() == naive_resample_order(
        kept, batch_size, repeat_count)


@settings(max_examples=40, deadline=None)
@given(kept=st.lists(st.integers(0, 50), min_size=1, max_size=6), batch_size=st.integers(1, 64),
       repeat_count=st.integers(1, 10**30))
def test_the_resampled_order_uses_memory_of_the_batch_whatever_the_repeat_count(kept, batch_size, repeat_count):
    import tracemalloc

    tracemalloc.start()
    try:
        order = resample_order(np.array(kept), batch_size, repeat_count)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A count past the batch fills it with the first kept prompt; below it, CoDaPO's loop.
    expected = naive_resample_order(kept, batch_size, min(repeat_count, batch_size))
    assert order.tolist() == expected
    assert peak < 64 * 1024  # a few arrays of batch_size int64s; 10**7 copies of 8 prompts took 580 MB before
