"""The APO advantage estimator: hand-computed numbers, properties, and verl's own call path."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage

from recipe_apo.methods.apo.anchor import AnchorBook, CapabilityAnchor, driver_anchors, reset_driver_anchors
from recipe_apo.methods.apo.estimator import compute_apo_advantage
from recipe_apo.methods.apo.settings import ApoConfigError, ApoSettings
from recipe_apo.methods.driver_state import last_result
from recipe_apo.methods.errors import BatchInputError

E_QUARTER = 1.2840254166877414  # exp(0.25)
E_MINUS_QUARTER = 0.7788007830714049  # exp(-0.25)


def outcome_rewards(rewards, lengths, width=6):
    """Token-level rewards with each response's reward on its last valid token, as verl's reward managers do."""
    n = len(rewards)
    token_rewards = torch.zeros(n, width)
    mask = torch.zeros(n, width)
    for i, (r, length) in enumerate(zip(rewards, lengths)):
        mask[i, :length] = 1.0
        if length:
            token_rewards[i, length - 1] = r
    return token_rewards, mask


@pytest.fixture(autouse=True)
def fresh_driver_anchor():
    reset_driver_anchors()
    yield
    reset_driver_anchors()


def test_four_quadrants_of_table_4_5_by_hand():
    # Hard group (p_hat = 0.25) and easy group (p_hat = 0.75); y_t = 0.5 keeps C at 0.5, so Delta = -/+0.25.
    rewards = [1, 0, 0, 0, 1, 1, 1, 0]
    lengths = [3, 6, 2, 5, 1, 4, 6, 2]
    token_rewards, mask = outcome_rewards(rewards, lengths)
    index = np.array(["hard"] * 4 + ["easy"] * 4, dtype=object)
    cfg = ApoSettings(lambda_scale=1.5, anchor_init=0.5)
    adv, metrics = compute_apo_advantage(token_rewards, mask, index, cfg, CapabilityAnchor(0.5))

    boost, temper = 1.5 * E_QUARTER, 1.5 * E_MINUS_QUARTER
    expected = [
        0.75 * boost,  # hard, A > 0: boost the rare success
        -0.25 * temper, -0.25 * temper, -0.25 * temper,  # hard, A < 0: temper expected failures
        0.25 * temper, 0.25 * temper, 0.25 * temper,  # easy, A > 0: dampen
        -0.75 * boost,  # easy, A < 0: amplify the rare failure
    ]
    torch.testing.assert_close(adv, torch.tensor(expected).unsqueeze(-1) * mask)
    assert metrics["apo/anchor"] == 0.5
    assert metrics["apo/batch_success"] == 0.5
    assert metrics["apo/harder_group_share"] == 0.5
    assert metrics["apo/uniform_group_share"] == 0.0
    assert metrics["apo/weight_pos_mean"] == pytest.approx((boost + 3 * temper) / 4)
    assert metrics["apo/weight_neg_mean"] == pytest.approx((3 * temper + boost) / 4)


def test_anchor_is_updated_before_the_gap_is_measured():
    # eta_min = 1 makes C jump to y_t = 0.5; measured after the update every gap is 0 and Phi = lambda.
    # Measured before it (C = 0.2), every group would look easy and get a weight != lambda.
    token_rewards, mask = outcome_rewards([1, 0, 0, 1], [2, 2, 2, 2])
    cfg = ApoSettings(lambda_scale=2.0, anchor_init=0.2, eta_min=1.0)
    adv, metrics = compute_apo_advantage(token_rewards, mask, np.array([0, 0, 1, 1]), cfg, CapabilityAnchor(0.2))
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    assert metrics["apo/anchor"] == 0.5 and metrics["apo/anchor_rate"] == 1.0


def test_uneven_groups_singletons_and_padding_give_exact_values():
    # Group a: rewards 1, 0, 0 (p_hat 1/3) plus a padding row; group b: a single response.
    token_rewards, mask = outcome_rewards([1, 0, 0, 1, 0], [2, 3, 1, 4, 0])
    index = np.array(["a", "a", "a", "b", "a"], dtype=object)
    cfg = ApoSettings(lambda_scale=1.0, anchor_init=0.5, eta_min=0.0)
    adv, metrics = compute_apo_advantage(token_rewards, mask, index, cfg, CapabilityAnchor(0.5))
    # The padding row takes no part: group a's mean and p_hat are 1/3, Delta = 1/3 - 0.5 = -1/6.
    boost, temper = math.exp(1 / 6), math.exp(-1 / 6)
    expected = torch.tensor([2 / 3 * boost, -1 / 3 * temper, -1 / 3 * temper, 0.0, 0.0])
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
    assert torch.isfinite(adv).all()
    assert adv[3].abs().sum() == 0 and adv[4].abs().sum() == 0
    assert metrics["apo/batch_success"] == 0.5  # (1 + 0 + 0 + 1) / 4 valid responses
    assert metrics["apo/uniform_group_share"] == 0.5  # the singleton group carries no signal


def test_verls_padding_rows_change_nothing():
    # verl pads a batch with all-masked rows under one made-up uid, copying a real row's data source; their
    # scores may be anything (here an out-of-domain 7 and a NaN, which must not be read).
    token_rewards, mask = outcome_rewards([1, 0, 0, 0, 1, 1], [2, 3, 1, 4, 2, 2])
    index = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    base, base_metrics = compute_apo_advantage(token_rewards, mask, index, ApoSettings(), CapabilityAnchor(0.4))
    padded_rewards = torch.cat([token_rewards, torch.tensor([[7.0] + [0.0] * 5, [float("nan")] + [0.0] * 5])])
    padded_mask = torch.cat([mask, torch.zeros(2, 6)])
    padded_index = np.concatenate([index, np.array(["pad1", "pad1"], dtype=object)])
    padded, padded_metrics = compute_apo_advantage(padded_rewards, padded_mask, padded_index, ApoSettings(),
                                                   CapabilityAnchor(0.4))
    torch.testing.assert_close(padded[:6], base)
    assert padded[6:].abs().sum() == 0
    assert padded_metrics == base_metrics


def test_a_batch_of_padding_only_leaves_the_anchor_alone():
    anchor = CapabilityAnchor(0.4)
    adv, metrics = compute_apo_advantage(torch.ones(3, 4), torch.zeros(3, 4), np.array([0, 0, 1]), ApoSettings(),
                                         anchor)
    assert adv.abs().sum() == 0 and anchor.steps == 0 and metrics == {}


def reference_apo(rewards, groups, anchor_value, lambda_scale):
    """APO weights written out per response, straight from the paper's formulas, without vectorization."""
    out = []
    for r, g in zip(rewards, groups):
        members = [rr for rr, gg in zip(rewards, groups) if gg == g]
        centered = r - sum(members) / len(members)
        gap = sum(members) / len(members) - anchor_value
        sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
        out.append(lambda_scale * math.exp(-sign(centered) * sign(gap) * abs(gap)) * centered)
    return out


group_batches = st.lists(
    st.tuples(st.integers(min_value=0, max_value=5), st.floats(min_value=0.0, max_value=1.0, width=32)),
    min_size=1,
    max_size=40,
)


@hsettings(max_examples=150, deadline=None)
@given(
    batch=group_batches,
    anchor_init=st.floats(min_value=0.0, max_value=1.0),
    lambda_scale=st.floats(min_value=0.05, max_value=5.0),
    binary=st.booleans(),
)
def test_matches_the_per_response_formula_preserves_sign_and_bounds_phi(batch, anchor_init, lambda_scale, binary):
    groups = [g for g, _ in batch]
    rewards = [float(round(r)) if binary else r for _, r in batch]
    token_rewards, mask = outcome_rewards(rewards, [3] * len(rewards), width=3)
    cfg = ApoSettings(lambda_scale=lambda_scale, anchor_init=anchor_init)
    anchor = CapabilityAnchor(anchor_init)
    adv, _ = compute_apo_advantage(token_rewards, mask, np.array(groups), cfg, anchor)
    scalar = adv[:, -1].double()

    expected = torch.tensor(reference_apo(rewards, groups, anchor.value, lambda_scale), dtype=torch.float64)
    torch.testing.assert_close(scalar, expected, atol=1e-5, rtol=1e-5)

    scores = torch.tensor(rewards, dtype=torch.float64)
    means = {g: np.mean([r for r, gg in zip(rewards, groups) if gg == g]) for g in set(groups)}
    centered = scores - torch.tensor([means[g] for g in groups], dtype=torch.float64)
    signal = centered.abs() > 1e-6
    assert torch.equal(torch.sign(scalar[signal]), torch.sign(centered[signal]))
    phi = scalar[signal] / centered[signal]
    assert (phi >= lambda_scale / math.e * (1 - 1e-4)).all() and (phi <= lambda_scale * math.e * (1 + 1e-4)).all()


@hsettings(max_examples=60, deadline=None)
@given(batch=group_batches)
def test_without_reweighting_equals_verl_grpo_without_std(batch):
    groups = [g for g, _ in batch] * 2  # every group has at least two responses
    rewards = [r for _, r in batch] * 2
    token_rewards, mask = outcome_rewards(rewards, [2] * len(rewards), width=4)
    index = np.array(groups)
    ours, _ = compute_apo_advantage(token_rewards, mask, index, ApoSettings(reweight=False), CapabilityAnchor())
    verls, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(ours, verls, atol=1e-6, rtol=1e-5)


def run_steps(anchor, cfg, success_rate, steps, n=80):
    """Feed `steps` batches whose success rate is exactly `success_rate`; return the anchor after each."""
    k = round(success_rate * n)
    token_rewards, mask = outcome_rewards([1.0] * k + [0.0] * (n - k), [2] * n, width=2)
    index = np.repeat(np.arange(n // 8), 8)
    values = []
    for _ in range(steps):
        _, metrics = compute_apo_advantage(token_rewards, mask, index, cfg, anchor)
        values.append(metrics["apo/anchor"])
    return values


def test_default_anchor_follows_a_step_in_success_within_50_steps():
    cfg = ApoSettings()
    anchor = CapabilityAnchor(cfg.anchor_init, cfg.history)
    run_steps(anchor, cfg, 0.2, 60)
    assert anchor.value == pytest.approx(0.2)
    after = run_steps(anchor, cfg, 0.8, 50)
    assert after[-1] > 0.5, after  # more than half of the step 0.2 -> 0.8
    assert all(b >= a for a, b in zip(after, after[1:]))
    assert next(i + 1 for i, v in enumerate(after) if v > 0.5) == 12  # docs/internals.md quotes it


@pytest.mark.parametrize("rate", [0.05, 0.5, 0.95])
@pytest.mark.parametrize("anchor_init", [None, 0.5, 0.0, 1.0])
def test_default_anchor_settles_near_a_constant_success_rate_within_30_steps(rate, anchor_init):
    cfg = ApoSettings(anchor_init=anchor_init)
    anchor = CapabilityAnchor(cfg.anchor_init, cfg.history)
    values = run_steps(anchor, cfg, rate, 30)
    assert abs(values[-1] - rate) < 0.15, values


@pytest.mark.parametrize("rate", [0.05, 0.95])
def test_from_half_way_the_default_anchor_is_within_015_after_18_steps(rate):
    cfg = ApoSettings(anchor_init=0.5)
    values = run_steps(CapabilityAnchor(0.5, cfg.history), cfg, rate, 30)
    assert next(i + 1 for i, v in enumerate(values) if abs(v - rate) < 0.15) == 18  # docs/internals.md quotes it


def test_papers_literal_rate_rule_never_moves_the_anchor():
    # eta_min = 0 is the paper's rule: H = [C_0] has std 0, so eta_t = 0 at every step.
    cfg = ApoSettings(eta_min=0.0, anchor_init=0.5, eta=2.0)
    values = run_steps(CapabilityAnchor(0.5, cfg.history), cfg, 0.9, 40)
    assert values == [0.5] * 40


def test_rate_grows_with_the_spread_of_the_history():
    anchor = CapabilityAnchor(0.2, history=4)
    assert anchor.next_rate(eta=1.0, eta_min=0.05) == 0.05
    anchor.history.extend([0.4, 0.2, 0.4])  # std of [0.2, 0.4, 0.2, 0.4] = 0.1
    assert anchor.next_rate(eta=3.0, eta_min=0.05) == pytest.approx(0.3)
    assert anchor.next_rate(eta=30.0, eta_min=0.05) == 1.0


def test_state_dict_round_trips_through_json_and_continues_identically():
    cfg = ApoSettings(anchor_init=0.3, history=5)
    anchor = CapabilityAnchor(0.3, 5)
    run_steps(anchor, cfg, 0.7, 7)
    restored = CapabilityAnchor()
    restored.load_state_dict(json.loads(json.dumps(anchor.state_dict())))
    assert restored.state_dict() == anchor.state_dict()
    assert run_steps(restored, cfg, 0.4, 3) == run_steps(anchor, cfg, 0.4, 3)


def test_malformed_state_is_refused_and_changes_nothing():
    anchor = CapabilityAnchor(0.3)
    before = anchor.state_dict()
    for bad in ({}, {**before, "value": 1.5}, {**before, "version": 99}, {**before, "history": ["x"]}):
        with pytest.raises(ValueError):
            anchor.load_state_dict(bad)
        assert anchor.state_dict() == before


def test_a_malformed_anchor_state_is_a_recipe_error_of_one_line():
    """Said as one line by ``python -m recipe_apo.main`` wherever it is raised (a ``RecipeError``), and still a
    ``ValueError`` for code written against the first release."""
    from recipe_apo.errors import RecipeError
    from recipe_apo.methods.errors import MethodStateError

    for anchor in (CapabilityAnchor(0.3), AnchorBook(init=0.3)):
        before = anchor.state_dict()
        for bad in ({}, [], {"version": 1, "anchors": {"global": {"version": 1, "value": "x"}}},
                    {**CapabilityAnchor(0.3).state_dict(), "steps": -1}):
            with pytest.raises(MethodStateError) as info:
                anchor.load_state_dict(bad)
            assert isinstance(info.value, RecipeError) and isinstance(info.value, ValueError)
            message = str(info.value)
            assert "\n" not in message and message.startswith(("malformed anchor state", "anchor state"))
            assert anchor.state_dict() == before


def assert_anchor_untouched(call):
    anchor = CapabilityAnchor(0.4)
    run_steps(anchor, ApoSettings(), 0.6, 3)
    before = anchor.state_dict()
    with pytest.raises(BatchInputError) as info:
        call(anchor)
    assert anchor.state_dict() == before
    return str(info.value)


def test_nan_and_inf_rewards_are_counted_located_and_leave_the_anchor_alone():
    token_rewards, mask = outcome_rewards([1, 0, 0, 1], [2, 2, 2, 2])
    token_rewards[1, 0] = float("nan")
    token_rewards[3, 1] = float("inf")
    message = assert_anchor_untouched(
        lambda a: compute_apo_advantage(token_rewards, mask, np.array([0, 0, 1, 1]), ApoSettings(), a)
    )
    assert "2 of 4 responses" in message and "[1, 3]" in message and "NaN/inf" in message


def test_rewards_outside_the_success_domain_name_the_setting():
    token_rewards, mask = outcome_rewards([1, -1, -1, 1], [2, 2, 2, 2])  # math_dapo-style +1/-1
    message = assert_anchor_untouched(
        lambda a: compute_apo_advantage(token_rewards, mask, np.array([0, 0, 1, 1]), ApoSettings(), a)
    )
    assert "algorithm.apo.success" in message and "2 of 4" in message
    minmax = ApoSettings(success="minmax", success_min=0.0, success_max=0.5)
    message = assert_anchor_untouched(
        lambda a: compute_apo_advantage(token_rewards.abs(), mask, np.array([0, 0, 1, 1]), minmax, a)
    )
    assert "success=minmax" in message


def test_index_length_mismatch_is_refused():
    token_rewards, mask = outcome_rewards([1, 0, 0], [2, 2, 2])
    message = assert_anchor_untouched(
        lambda a: compute_apo_advantage(token_rewards, mask, np.array([0, 0]), ApoSettings(), a)
    )
    assert "3 responses" in message and "uid" in message


def test_success_mappings_for_other_reward_ranges():
    token_rewards, mask = outcome_rewards([1, -1, -1, -1], [2, 2, 2, 2])
    for cfg in (ApoSettings(success="threshold", success_threshold=0.0, anchor_init=0.5),
                ApoSettings(success="minmax", success_min=-1.0, success_max=1.0, anchor_init=0.5)):
        anchor = CapabilityAnchor(0.5)
        adv, metrics = compute_apo_advantage(token_rewards, mask, np.zeros(4, dtype=int), cfg, anchor)
        assert metrics["apo/batch_success"] == 0.25
        # A = R - mean(R) = 1.5, -0.5, -0.5, -0.5 with the group harder than the anchor.
        gap = 0.25 - anchor.value
        assert adv[0, 1].item() == pytest.approx(1.5 * 1.5 * math.exp(-gap))
        assert adv[1, 1].item() == pytest.approx(-0.5 * 1.5 * math.exp(gap))


@pytest.mark.parametrize(
    "apo_node, key",
    [
        ({"lambda_scale": 0}, "lambda_scale"),
        ({"lambda_scale": -1.0}, "lambda_scale"),
        ({"history": 0}, "history"),
        ({"eta": -0.1}, "eta"),
        ({"eta_min": 1.5}, "eta_min"),
        ({"anchor_init": 1.2}, "anchor_init"),
        ({"success": "sigmoid"}, "success"),
        ({"success": "minmax", "success_min": 1, "success_max": 1}, "success_max"),
        ({"lambda_sacle": 1.2}, "lambda_sacle"),
    ],
)
def test_invalid_settings_are_one_line_errors_naming_the_key(apo_node, key):
    with pytest.raises(ApoConfigError) as info:
        ApoSettings.from_algorithm_config(OmegaConf.create({"apo": apo_node}))
    message = str(info.value)
    assert f"algorithm.apo.{key}" in message and "\n" not in message


def test_settings_default_when_the_node_is_absent():
    assert ApoSettings.from_algorithm_config(OmegaConf.create({"gamma": 1.0})) == ApoSettings()
    assert ApoSettings.from_algorithm_config(None) == ApoSettings()


def test_through_verl_compute_advantage_with_a_real_dataproto():
    rewards = [1, 0, 0, 0, 1, 1, 1, 0]
    token_rewards, mask = outcome_rewards(rewards, [3, 6, 2, 5, 1, 4, 6, 2])
    uids = np.array(["u1"] * 4 + ["u2"] * 4, dtype=object)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask},
        non_tensors={"uid": uids},
    )
    algorithm = OmegaConf.create({"adv_estimator": "apo", "apo": {"lambda_scale": 1.5, "anchor_init": 0.5}})
    out = compute_advantage(data, adv_estimator="apo", config=algorithm)

    direct, _ = compute_apo_advantage(
        token_rewards, mask, uids, ApoSettings(lambda_scale=1.5, anchor_init=0.5), CapabilityAnchor(0.5)
    )
    torch.testing.assert_close(out.batch["advantages"], direct)
    torch.testing.assert_close(out.batch["returns"], direct)
    assert driver_anchors().anchor().steps == 1 and last_result("apo").metrics["apo/anchor"] == 0.5

    compute_advantage(data, adv_estimator="apo", config=algorithm)
    assert driver_anchors().anchor().steps == 2  # one anchor per driver process, carried across steps


def test_one_anchor_per_data_source_measures_its_own_groups():
    # Source "easy" succeeds 3 of 4 times, source "hard" 1 of 4; eta_min = 1 puts each anchor at its own rate.
    token_rewards, mask = outcome_rewards([1, 1, 1, 0, 1, 0, 0, 0], [2] * 8)
    index = np.array(["e1", "e1", "e2", "e2", "h1", "h1", "h2", "h2"], dtype=object)
    scopes = np.array(["easy"] * 4 + ["hard"] * 4, dtype=object)
    cfg = ApoSettings(lambda_scale=1.0, eta_min=1.0, anchor_scope="data_source")
    book = AnchorBook(init=0.5)
    adv, metrics = compute_apo_advantage(token_rewards, mask, index, cfg, book, scopes)
    assert book.anchor("easy").value == 0.75 and book.anchor("hard").value == 0.25
    assert metrics["apo/anchor/easy"] == 0.75 and metrics["apo/anchor/hard"] == 0.25
    assert metrics["apo/batch_success"] == 0.5
    # Group e2 (p_hat 0.5) is harder than its anchor 0.75: Delta = -0.25. Group h1 (0.5) is easier than 0.25.
    torch.testing.assert_close(adv[2:6, 0], torch.tensor(
        [0.5 * E_QUARTER, -0.5 * E_MINUS_QUARTER, 0.5 * E_MINUS_QUARTER, -0.5 * E_QUARTER]))
    torch.testing.assert_close(adv[:2, 0], torch.zeros(2))  # e1 is uniform

    # A global anchor (0.5) would see both e2 and h1 exactly at the anchor: Phi = lambda.
    glob, _ = compute_apo_advantage(token_rewards, mask, index, ApoSettings(lambda_scale=1.0, eta_min=1.0),
                                    CapabilityAnchor(0.5))
    torch.testing.assert_close(glob[2:6, 0], torch.tensor([0.5, -0.5, 0.5, -0.5]))


def test_a_group_spanning_two_data_sources_is_refused():
    token_rewards, mask = outcome_rewards([1, 0, 1, 0], [2] * 4)
    book = AnchorBook(init=0.5)
    book.anchor("a")
    before = book.state_dict()
    with pytest.raises(BatchInputError, match="mix data sources"):
        compute_apo_advantage(token_rewards, mask, np.array([0, 0, 1, 1]), ApoSettings(anchor_scope="data_source"),
                              book, np.array(["a", "b", "b", "b"], dtype=object))
    assert book.state_dict() == before


def test_data_source_scope_without_the_recipe_trainer_is_a_clear_error():
    token_rewards, mask = outcome_rewards([1, 0], [2, 2])
    algorithm = OmegaConf.create({"apo": {"anchor_scope": "data_source"}})
    with pytest.raises(BatchInputError, match="python -m recipe_apo.main"):
        core_algos.get_adv_estimator_fn("apo")(token_level_rewards=token_rewards, response_mask=mask,
                                               config=algorithm, index=np.array([0, 0]))


def test_anchor_book_state_round_trips_and_refuses_bad_states():
    book = AnchorBook(init=0.3, history=5)
    cfg = ApoSettings(history=5, anchor_scope="data_source")
    token_rewards, mask = outcome_rewards([1, 0, 0, 0], [2] * 4)
    scopes = np.array(["x", "x", "y", "y"], dtype=object)
    for _ in range(4):
        compute_apo_advantage(token_rewards, mask, np.array([0, 0, 1, 1]), cfg, book, scopes)
    restored = AnchorBook(history=5)
    restored.load_state_dict(json.loads(json.dumps(book.state_dict())))
    assert restored.state_dict() == book.state_dict()
    before = restored.state_dict()
    bad = json.loads(json.dumps(before))
    bad["anchors"]["y"]["value"] = 7.0
    with pytest.raises(ValueError):
        restored.load_state_dict(bad)
    assert restored.state_dict() == before


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.int64, torch.bool])
def test_the_callers_mask_is_left_untouched_whatever_its_dtype(mask_dtype):
    token_rewards, mask = outcome_rewards([1, 0, 0, 1], [2, 3, 1, 4])
    mask = mask.to(mask_dtype)
    before = mask.clone()
    adv, _ = compute_apo_advantage(token_rewards, mask, np.array([0, 0, 1, 1]), ApoSettings(), CapabilityAnchor(0.5))
    assert torch.equal(mask, before) and adv.dtype == torch.float32
    assert torch.equal(adv != 0, before.bool() & (adv != 0))


# ---- one training step, one anchor move: verl's mini-batches (parameter_sync_step) -----------------------------
def apo_step(book, rewards, groups, settings, scopes=None):
    token_rewards, mask = outcome_rewards(rewards, [2] * len(rewards))
    return compute_apo_advantage(token_rewards, mask, np.array(groups, dtype=object), settings, book,
                                 None if scopes is None else np.array(scopes, dtype=object))


@given(st.lists(st.lists(st.integers(0, 1), min_size=8, max_size=8), min_size=1, max_size=5),
       st.sampled_from([1, 2, 4]), st.booleans())
@hsettings(max_examples=40, deadline=None)
def test_a_step_as_one_batch_or_as_mini_batches_leaves_the_same_anchors(steps, pieces, by_source):
    """Each step's 8 responses (4 groups of 2) as one estimator call, or cut in ``pieces`` calls inside one
    training step: the same anchors after every step (values, history, step count), and the last call's Phi_i
    measured against the step's anchor, as the whole batch's are."""
    settings = ApoSettings(eta=2.0, eta_min=0.05, anchor_init=0.5, history=4,
                           anchor_scope="data_source" if by_source else "global")
    whole, cut = AnchorBook(init=0.5, history=4), AnchorBook(init=0.5, history=4)
    groups = ["a", "a", "b", "b", "c", "c", "d", "d"]
    scopes = ["x", "x", "x", "x", "y", "y", "y", "y"] if by_source else None
    for rewards in steps:
        whole.begin_step()
        whole_adv, _ = apo_step(whole, rewards, groups, settings, scopes)
        cut.begin_step()
        width = len(rewards) // pieces
        for k in range(pieces):
            part = slice(k * width, (k + 1) * width)
            adv, _ = apo_step(cut, rewards[part], groups[part], settings, scopes and scopes[part])
        assert cut.state_dict() == whole.state_dict()
        torch.testing.assert_close(adv, whole_adv[part], rtol=0, atol=0)
    # Outside a training step (plain verl) every call is a step of its own: 4 calls move the anchor 4 times.
    free = AnchorBook(init=0.5, history=4)
    for k in range(4):
        apo_step(free, steps[0][2 * k:2 * k + 2], groups[2 * k:2 * k + 2], settings, scopes and scopes[2 * k:2 * k + 2])
    assert sum(a["steps"] for a in free.state_dict()["anchors"].values()) == 4


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 1), st.integers(1, 4)), min_size=1, max_size=24),
       st.randoms(use_true_random=False), st.booleans())
@hsettings(max_examples=60, deadline=None)
def test_rows_in_any_order_get_the_same_advantages_and_anchors(rows, rng, by_source):
    """verl reorders a step's rows before the estimator sees them (balance_batch, data-parallel padding, the
    workers' order): a permutation of the rows permutes the advantages, to the bit, and leaves the anchors alike."""
    settings = ApoSettings(lambda_scale=1.1, anchor_init=0.3, anchor_scope="data_source" if by_source else "global")
    order = list(range(len(rows)))
    rng.shuffle(order)
    results = []
    for perm in (range(len(rows)), order):
        groups = np.array([rows[i][0] for i in perm], dtype=object)
        scopes = np.array(["x" if g in "ab" else "y" for g in groups], dtype=object) if by_source else None
        token_rewards, mask = outcome_rewards([float(rows[i][1]) for i in perm], [rows[i][2] for i in perm])
        book = AnchorBook(init=0.3)
        adv, metrics = compute_apo_advantage(token_rewards, mask, groups, settings, book, scopes)
        results.append((adv, book.state_dict(), metrics))
    (adv, state, metrics), (adv_shuffled, state_shuffled, metrics_shuffled) = results
    assert torch.equal(adv_shuffled, adv[order])
    assert state_shuffled == state and metrics_shuffled.keys() == metrics.keys()
    for key in metrics:
        assert metrics_shuffled[key] == pytest.approx(metrics[key], rel=1e-12, abs=1e-12), key


def test_the_step_pools_its_mini_batches_success_by_hand():
    settings = ApoSettings(eta=1.0, eta_min=0.5, anchor_init=0.5, history=4)
    book = AnchorBook(init=0.5, history=4)
    book.begin_step()
    # Mini-batch 1: 1 success in 4 -> y = 1/4; eta_1 = max(1.0 * std([0.5]), 0.5) = 0.5; C = 0.5*0.5 + 0.5*0.25.
    _, first = apo_step(book, [1, 0, 0, 0], ["a", "a", "b", "b"], settings)
    assert first["apo/batch_success"] == 0.25 and first["apo/anchor"] == 0.375
    # Mini-batch 2: 3 in 4; pooled y = 4/8 = 1/2, from the step's start: C = 0.5*0.5 + 0.5*0.5 = 0.5.
    _, second = apo_step(book, [1, 1, 1, 0], ["c", "c", "d", "d"], settings)
    assert second["apo/batch_success"] == 0.5 and second["apo/anchor"] == 0.5
    assert book.step_results == {"global": (0.5, 0.5, 0.5)}
    assert book.anchor().steps == 1 and list(book.anchor().history) == [0.5, 0.5]


def test_a_refused_mini_batch_leaves_the_step_as_it_was():
    settings = ApoSettings(anchor_init=0.5)
    book = AnchorBook(init=0.5)
    book.begin_step()
    apo_step(book, [1, 0, 0, 0], ["a", "a", "b", "b"], settings)
    before = (book.state_dict(), dict(book._step_seen), dict(book.step_results))
    token_rewards, mask = outcome_rewards([math.nan, 0], [2, 2])
    with pytest.raises(BatchInputError):
        compute_apo_advantage(token_rewards, mask, np.array(["c", "c"], dtype=object), settings, book)
    assert (book.state_dict(), dict(book._step_seen), dict(book.step_results)) == before


def test_the_prior_anchor_order_measures_groups_against_the_anchor_before_the_update():
    """HA-DW's order (anchor_order=prior) by hand: one group of 4 with rewards 1, 1, 0, 0 (p_hat 1/2, A = +-1/2),
    anchor 0.8 before the step, eta_t = max(1.0 * std([0.8]), 0.5) = 0.5."""
    token_rewards, mask = outcome_rewards([1, 1, 0, 0], [2, 2, 2, 2])
    index = np.array(["g"] * 4, dtype=object)
    common = dict(lambda_scale=1.0, eta=1.0, eta_min=0.5, anchor_init=0.8)
    prior_anchor, paper_anchor = CapabilityAnchor(0.8), CapabilityAnchor(0.8)
    prior, _ = compute_apo_advantage(token_rewards, mask, index, ApoSettings(**common, anchor_order="prior"),
                                     prior_anchor)
    paper, _ = compute_apo_advantage(token_rewards, mask, index, ApoSettings(**common), paper_anchor)
    # Both move the anchor alike: C_{t+1} = 0.5 * 0.8 + 0.5 * 0.5 = 0.65.
    assert prior_anchor.value == paper_anchor.value == 0.65
    # prior: Delta = 0.5 - 0.8 = -0.3 (harder than the model): successes boosted by e^0.3, failures tempered.
    torch.testing.assert_close(prior[:, 0], torch.tensor([0.5 * math.exp(0.3)] * 2 + [-0.5 * math.exp(-0.3)] * 2))
    # paper: Delta = 0.5 - 0.65 = -0.15.
    torch.testing.assert_close(paper[:, 0], torch.tensor([0.5 * math.exp(0.15)] * 2 + [-0.5 * math.exp(-0.15)] * 2))


@pytest.mark.parametrize("in_a_step", [False, True], ids=["bare-call", "trainer-step"])
def test_the_prior_order_measures_a_new_scopes_first_step_against_anchor_init(in_a_step):
    """anchor_init=0.5, eta_min=1 (the anchor jumps to y_t), one group with rewards 1, 0, 0, 0: p_hat = 1/4,
    A = 3/4 for the success. Its prior is C_0 = 0.5, so Delta = 1/4 - 1/2 = -1/4 and Phi = exp(1/4):
    0.75 * e^0.25 = 0.963 (measured against C_1 = 1/4 it would be Delta = 0 and 0.750). The same for a data
    source first seen at step 2 of a data_source-scoped run, whose prior is C_0 too, not its own C_1."""
    settings = ApoSettings(lambda_scale=1.0, eta_min=1.0, anchor_init=0.5, anchor_order="prior",
                           anchor_scope="data_source")
    book = AnchorBook(init=0.5)
    rewards, groups = [1, 0, 0, 0], ["g"] * 4
    expected = torch.tensor([0.75 * math.exp(0.25)] + [-0.25 * math.exp(-0.25)] * 3)
    for step, source in enumerate(["math", "code"]):  # "code" is born mid-run, at the second step
        if in_a_step:
            book.begin_step()
        advantages, _ = apo_step(book, rewards, groups, settings, scopes=[source] * 4)
        torch.testing.assert_close(advantages[:, 0], expected)
        assert round(float(advantages[0, 0]), 3) == 0.963, step
        assert last_result("apo").per_response["anchor"].tolist() == [0.5] * 4
        assert book.anchor(source).value == 0.25  # the anchor itself moved as in the paper's order
    # A second step of the first source is measured against its C_1 = 1/4 (Delta = 0: Phi = 1).
    if in_a_step:
        book.begin_step()
    advantages, _ = apo_step(book, rewards, groups, settings, scopes=["math"] * 4)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_the_prior_order_warm_starts_at_the_first_batchs_success_and_then_lags_a_step():
    settings = ApoSettings(lambda_scale=1.0, eta=1.0, eta_min=0.5, anchor_order="prior")
    book = AnchorBook()
    index = np.array(["g"] * 4, dtype=object)
    # Step 1 without anchor_init: the prior is the first batch's success rate, 3/4; p_hat = 3/4: Delta = 0.
    first, _ = compute_apo_advantage(*outcome_rewards([1, 1, 1, 0], [2] * 4), index, settings, book)
    torch.testing.assert_close(first[:, 0], torch.tensor([0.25, 0.25, 0.25, -0.75]))
    assert last_result("apo").per_response["anchor"].tolist() == [0.75] * 4
    # Step 2: measured against C_1 = 0.75 (the paper's order would use C_2 = 0.5 * 0.75 + 0.5 * 0.25 = 0.5).
    second, _ = compute_apo_advantage(*outcome_rewards([1, 0, 0, 0], [2] * 4), index, settings, book)
    torch.testing.assert_close(second[:, 0], torch.tensor([0.75 * math.exp(0.5)] + [-0.25 * math.exp(-0.5)] * 3))
    assert book.anchor().value == 0.5 and last_result("apo").per_response["anchor"].tolist() == [0.75] * 4
    with pytest.raises(ApoConfigError, match="algorithm.apo.anchor_order must be one of paper, prior, got 'before'"):
        ApoSettings(anchor_order="before")
