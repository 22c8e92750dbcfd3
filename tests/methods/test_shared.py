"""The helpers the methods share (groups, settings, errors, tensors) and the estimator's padding-row shortcut."""

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recipe_apo.errors import RecipeError
from recipe_apo.methods import checks, driver_state, groups, settings
from recipe_apo.methods.apo import estimator as apo
from recipe_apo.methods.apo.anchor import driver_anchors, reset_driver_anchors
from recipe_apo.methods.apo.settings import ApoConfigError, ApoSettings
from recipe_apo.methods.codapo.settings import CodapoConfigError, CodapoSettings
from recipe_apo.methods.errors import BatchInputError, MethodConfigError


def test_errors_are_recipe_errors_and_value_errors():
    assert issubclass(BatchInputError, RecipeError) and issubclass(BatchInputError, ValueError)
    assert issubclass(MethodConfigError, RecipeError) and issubclass(MethodConfigError, ValueError)
    assert issubclass(ApoConfigError, MethodConfigError) and issubclass(CodapoConfigError, MethodConfigError)
    with pytest.raises(MethodConfigError, match="algorithm.apo.eta"):
        ApoSettings.from_algorithm_config({"apo": {"eta": -1.0}})
    with pytest.raises(MethodConfigError, match="algorithm.codapo.percentile"):
        CodapoSettings.from_algorithm_config({"codapo": {"percentile": 2.0}})


@pytest.mark.parametrize("value, kwargs, message", [
    (True, {}, "x must be a finite number, got True"),
    ("1.5", {}, "x must be a finite number, got '1.5'"),
    (float("inf"), {}, "x must be a finite number, got inf"),
    (-1, {"low": 0.0}, "x must be >= 0.0, got -1"),
    (0.0, {"low": 0.0, "low_open": True}, "x must be > 0.0, got 0.0"),
    (2, {"high": 1.0}, "x must be <= 1.0, got 2"),
    (1.0, {"low": 0.0, "high": 1.0, "low_open": True, "high_open": True}, "x must be a number in (0, 1), got 1.0"),
    (0.0, {"low": 0.0, "high": 1.0, "high_open": True}, None),
])
def test_check_number_takes_finite_reals_in_the_bounds_only(value, kwargs, message):
    if message is None:
        assert checks.check_number("x", value, MethodConfigError, **kwargs) == value
        return
    with pytest.raises(MethodConfigError) as info:
        checks.check_number("x", value, MethodConfigError, **kwargs)
    assert str(info.value) == message


def test_check_integer_flag_and_choice_name_the_setting():
    assert checks.check_integer("n", np.int64(3), MethodConfigError, low=1) == 3
    for value, message in [(True, "n must be an integer in [1, 5], got True"),
                           (2.0, "n must be an integer in [1, 5], got 2.0"),
                           (6, "n must be an integer in [1, 5], got 6")]:
        with pytest.raises(MethodConfigError) as info:
            checks.check_integer("n", value, MethodConfigError, low=1, high=5)
        assert str(info.value) == message
    with pytest.raises(MethodConfigError, match=r"^f must be true or false, got 'no' \(a string: drop the quotes\)$"):
        checks.check_flag("f", "no", MethodConfigError)
    with pytest.raises(MethodConfigError, match="^c must be one of a, b, got 'z'$"):
        checks.check_choice("c", "z", ("a", "b"), MethodConfigError)


def test_batch_checks_count_and_name_the_rows_at_fault():
    with pytest.raises(BatchInputError, match=r"^a \(2, 3\), b \(2, 4\) must all be \(batch, response_len\)"):
        checks.check_shapes(a=torch.zeros(2, 3), b=torch.zeros(2, 4))
    with pytest.raises(BatchInputError, match=r"must all be"):
        checks.check_shapes(a=torch.zeros(3))
    values = np.array([1.0, np.nan, np.inf, np.nan])
    checks.check_finite(values, np.array([True, False, False, False]), "rewards")  # padding may hold anything
    with pytest.raises(BatchInputError) as info:
        checks.check_finite(values, np.ones(4, dtype=bool), "rewards")
    assert str(info.value) == "token_level_rewards: 3 of 4 responses have NaN/inf rewards, first rows [1, 2, 3]"
    assert checks.output_dtype(torch.zeros(1, dtype=torch.int64)) == torch.float32
    assert checks.output_dtype(torch.zeros(1, dtype=torch.bfloat16)) == torch.bfloat16
    checks.check_no_overflow(65504.0, torch.float16, "", "fits")
    for largest in (65520.0, float("nan"), float("inf")):
        with pytest.raises(BatchInputError, match=r"^p: advantages would overflow float16 \(max 6.55e\+04\): why$"):
            checks.check_no_overflow(largest, torch.float16, "p: ", "why")


def test_group_range_and_rates():
    codes, n_groups = groups.group_codes(["a", "b", "a", "c"])
    assert codes.tolist() == [0, 1, 0, 2] and n_groups == 3
    low, high = groups.group_range(codes[:3], n_groups, [2.0, 5.0, -1.0])
    assert low.tolist() == [-1.0, 5.0, np.inf] and high.tolist() == [2.0, 5.0, -np.inf]
    assert groups.group_rates(codes, n_groups, [1, 0, 0, 1]).tolist() == [0.5, 0.0, 1.0]


def test_the_driver_state_restores_what_it_replaced():
    assert driver_state.handed_scopes() is None and driver_state.handed_log_probs() is None
    log_probs = torch.zeros(2, 3)
    with driver_state.handed(scopes=["a", "b"], old_log_probs=log_probs):
        assert driver_state.handed_scopes().tolist() == ["a", "b"] and driver_state.handed_log_probs() is log_probs
        # Each runtime holds its own inputs: an inner hand-off of other inputs keeps what the outer one gave.
        with driver_state.handed(scopes=["c", "d"]):
            assert driver_state.handed_scopes().tolist() == ["c", "d"] and driver_state.handed_log_probs() is log_probs
        with driver_state.handed():
            assert driver_state.handed_scopes().tolist() == ["a", "b"]
        assert driver_state.handed_scopes().tolist() == ["a", "b"]
    assert driver_state.handed_scopes() is None and driver_state.handed_log_probs() is None

    class Module:
        name = "verl's"

    with pytest.raises(RuntimeError):
        with driver_state.swapped(Module, "name", "ours"):
            assert Module.name == "ours"
            raise RuntimeError
    assert Module.name == "verl's"

    driver_state.record_result("x", {"m": 1.0}, phi=np.ones(2))
    assert driver_state.last_result("x").metrics == {"m": 1.0}
    driver_state.clear_results("x")
    assert driver_state.last_result("x") is None
    book = driver_anchors(init=0.5, history=3)
    assert driver_anchors() is book and book.init == 0.5
    reset_driver_anchors()
    assert driver_anchors() is not book


def test_read_settings_takes_a_dict_a_node_an_object_or_nothing_and_refuses_unknown_keys():
    from omegaconf import OmegaConf

    assert settings.read_settings(ApoSettings, None, "apo", ApoConfigError) == ApoSettings()
    assert settings.read_settings(ApoSettings, {"apo": {"eta": 0.5}}, "apo", ApoConfigError).eta == 0.5
    node = OmegaConf.create({"apo": {"history": 7}})
    assert settings.read_settings(ApoSettings, node, "apo", ApoConfigError).history == 7
    with pytest.raises(ApoConfigError, match="unknown setting algorithm.apo.etaa; known settings: anchor_init"):
        settings.read_settings(ApoSettings, {"apo": {"etaa": 1}}, "apo", ApoConfigError)
    with pytest.raises(ApoConfigError, match="algorithm.apo must be a mapping of settings, got int"):
        settings.read_settings(ApoSettings, {"apo": 3}, "apo", ApoConfigError)


LABELS = st.sampled_from(["a", "b", "c", None, float("nan"), 1, 1.0, True, 0.0, -0.0, (1, 2)])


@hsettings(max_examples=300, deadline=None)
@given(labels=st.lists(LABELS, max_size=30), runs=st.booleans())
def test_group_ids_are_pandas_codes_whether_or_not_groups_come_in_runs(labels, runs):
    if runs:
        labels = [label for label in labels for _ in range(3)]
    array = np.empty(len(labels), dtype=object)
    array[:] = labels
    codes, uniques = pd.factorize(array)
    if len(labels) and codes.min() < 0:
        rows = np.flatnonzero(codes < 0)
        with pytest.raises(BatchInputError, match=rf"has {rows.size} missing uids, first rows"):
            groups.group_ids(array, len(labels))
        return
    ours, n_groups = groups.group_ids(array, len(labels))
    assert ours.dtype == np.int64 and ours.tolist() == codes.tolist() and n_groups == len(uniques)


def test_group_ids_of_uids_pandas_cannot_compare_and_of_other_arrays():
    with pytest.raises(BatchInputError, match="has 1 missing uids, first rows \\[2\\]"):
        groups.group_ids(np.array(["a", "a", pd.NA, "b"], dtype=object), 4)
    uids = np.repeat(np.array(["u1", "u2", "u1"]), 2)  # a numpy str array; u1 appears twice, apart
    assert groups.group_ids(uids, 6)[0].tolist() == [0, 0, 1, 1, 0, 0]
    assert groups.group_ids(torch.tensor([3, 3, 1, 1]), 4)[0].tolist() == [0, 0, 1, 1]
    with pytest.raises(BatchInputError, match="has shape \\(3,\\) but the batch has 4 responses"):
        groups.group_ids(np.array(["a", "a", "b"]), 4)


def test_group_mean_is_zero_for_a_group_without_weight():
    codes = np.array([0, 0, 1, 2])
    counts = np.array([2.0, 0.0, 1.0])
    values = np.array([1.0, 3.0, 0.0, 5.0])
    assert groups.group_mean(codes, values, counts).tolist() == [2.0, 0.0, 5.0]
    assert groups.group_mean(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)).dtype == np.float64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.bool])
def test_response_rewards_are_float64_row_sums(dtype):
    rewards = torch.tensor([[0, 1, 1], [0, 0, 0], [1, 1, 1]]).to(dtype)
    sums = groups.response_rewards(rewards)
    assert sums.dtype == np.float64 and sums.tolist() == [2.0, 0.0, 3.0]


MASK_VALUES = st.sampled_from([0.0, 0.0, 0.0, 1.0, 1.0, -1.0, 0.5, 2.0, float("nan")])


@hsettings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.lists(MASK_VALUES, min_size=4, max_size=4), min_size=1, max_size=12),
    dtype=st.sampled_from([torch.int64, torch.bool, torch.float32, torch.float16, torch.bfloat16, torch.float64]),
)
def test_the_first_token_shortcut_finds_the_rows_amax_finds(rows, dtype):
    mask = torch.tensor(rows, dtype=torch.float64)
    if not dtype.is_floating_point:
        mask = torch.nan_to_num(mask, nan=3.0)
    mask = mask.to(dtype)
    expected = (mask.amax(dim=-1) != 0).numpy()
    assert apo._valid_rows(mask).tolist() == expected.tolist()


def test_most_rows_starting_masked_take_the_full_maxima():
    mask = torch.zeros(10, 5, dtype=torch.int64)
    mask[:7, 2:] = 1  # seven rows start masked and have valid tokens later; the others are padding
    assert apo._valid_rows(mask).tolist() == [True] * 7 + [False] * 3
    mask[8, 0] = 1
    assert apo._valid_rows(mask).tolist() == [True] * 7 + [False, True, False]


# ---- the response mask, the advantages' range, verl's loss settings (issue 51, items 4 and 5) -------------------
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                                   torch.float32, torch.float64])
def test_a_0_1_mask_of_any_dtype_verl_hands_over_passes(dtype):
    checks.check_mask(torch.tensor([[1, 1, 0], [0, 0, 0]]).to(dtype))
    checks.check_mask(torch.zeros(0, 3, dtype=dtype))


@pytest.mark.parametrize("value, shown", [(float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf"),
                                          (2.0, "2"), (-1.0, "-1"), (1.0000001, "1")])
def test_a_mask_value_outside_0_1_is_refused_naming_the_rows(value, shown):
    mask = torch.ones(5, 3, dtype=torch.float64)
    mask[1, 2] = mask[3, 0] = value
    with pytest.raises(BatchInputError) as refused:
        checks.check_mask(mask, prefix="m: ")
    assert str(refused.value) == (
        f"m: response_mask: 2 of 5 responses have a mask value that is NaN, inf or outside [0, 1], first rows [1, 3] "
        f"(row 1 holds {shown}); a mask is 0 or 1 per token")


def test_an_integer_mask_of_2_and_a_mask_of_another_dtype_are_refused():
    with pytest.raises(BatchInputError, match=r"^response_mask: 1 of 2 responses .* \(row 0 holds 2\)"):
        checks.check_mask(torch.tensor([[2, 1], [1, 0]]))
    for dtype in (torch.complex64, torch.uint16, torch.float8_e4m3fn):
        name = str(dtype).removeprefix("torch.")
        with pytest.raises(BatchInputError, match=rf"^response_mask is {name}: a mask is bool, an integer \(int8 to "
                                                  r"int64, uint8\) or a float"):
            checks.check_mask(torch.ones(2, 2).to(dtype))


@pytest.mark.parametrize("dtype, fits, overflows", [
    (torch.float16, 65504.0, 65520.0),
    (torch.bfloat16, 3.3895313892515355e38, 3.4e38),
    (torch.float32, 3.4028234663852886e38, 3.5e38),
    (torch.float64, 1.7976931348623157e308, float("inf")),
])
def test_advantages_are_checked_against_their_dtypes_largest_value(dtype, fits, overflows):
    checks.check_advantages("m", np.array([0.0, -fits, fits]), dtype)
    with pytest.raises(BatchInputError) as refused:
        checks.check_advantages("m", np.array([0.0, 1.0, -overflows, float("nan"), overflows]), dtype, "why")
    name = str(dtype).removeprefix("torch.")
    limit = float(torch.finfo(dtype).max)
    assert str(refused.value) == (f"m: the advantages of 3 of 5 responses are not finite in {name} (max {limit:.3g}), "
                                  f"first row 2 (advantage {-overflows:.4g} in float64): why")


def test_a_value_that_fits_stays_finite_through_rounding_and_a_mask_in_0_1():
    """What check_advantages relies on: each float64 advantage at most the dtype's max, times a mask in [0, 1],
    rounds to a finite value of the dtype."""
    from recipe_apo.methods.tensors import from_float64

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        limit = float(torch.finfo(dtype).max)
        values = np.array([limit, -limit, np.nextafter(limit, 0.0), 0.5])
        mask = torch.tensor([[1.0, 0.999, 0.0], [1.0, 1.0, 1.0], [0.5, 1e-30, 1.0], [1.0, 1.0, 0.0]]).to(dtype)
        out = torch.empty_like(mask).copy_(mask).mul_(from_float64(values, dtype, mask.device).unsqueeze(-1))
        assert torch.isfinite(out).all()


def test_the_loss_settings_bounds_name_the_key_and_take_nulls_as_verls_fallback():
    base = {"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
            "kl_loss_coef": 0.001, "entropy_coeff": 0.0}
    checks.check_loss_settings(base, MethodConfigError, prefix="a.")
    checks.check_loss_settings({}, MethodConfigError, prefix="a.")  # verl's defaults
    checks.check_loss_settings({**base, "clip_ratio": 0.0}, MethodConfigError)  # low falls back to 0: [1, 1.28]
    for change, message in [
        ({"clip_ratio_c": 1}, "a.clip_ratio_c must be > 1.0, got 1"),
        ({"clip_ratio": float("nan")}, "a.clip_ratio must be a finite number, got nan"),
        ({"clip_ratio_high": 0.0, "clip_ratio": 0.0}, "a.clip_ratio_low=0.0 and clip_ratio_high=0.0: the clip range "
                                                      "[1 - low, 1 + high] is the single ratio 1"),
        ({"clip_ratio_low": 1.25}, "a.clip_ratio_low=1.25: the clip range's lower end 1 - clip_ratio_low = -0.25 is "
                                   "below 0, no bound on a ratio (which is > 0); at most 1"),
        ({"clip_ratio_high": True}, "a.clip_ratio_high must be a finite number, got True"),
        ({"kl_loss_coef": -1e-9}, "a.kl_loss_coef must be >= 0.0, got -1e-09"),
        ({"entropy_coeff": float("-inf")}, "a.entropy_coeff must be a finite number, got -inf"),
    ]:
        with pytest.raises(MethodConfigError) as refused:
            checks.check_loss_settings({**base, **change}, MethodConfigError, prefix="a.")
        assert str(refused.value).startswith(message)


@pytest.mark.parametrize("index, said", [
    ([["a"], ["a", "b"], "c"], "the uid of row 0 is a list, which cannot name a group"),
    (np.array([1, 2, {3: 4}], dtype=object), "the uid of row 2 is a dict, which cannot name a group"),
    ([["a"], ["b"], ["c"]], "has shape (3, 1) but the batch has 3 responses; pass one uid (a str or an int)"),
    ("abc", "has shape () but the batch has 3 responses"),
])
def test_an_index_that_is_not_one_label_per_response_is_one_line(index, said):
    with pytest.raises(BatchInputError) as refused:
        groups.group_ids(index, 3)
    assert said in str(refused.value) and str(refused.value).startswith("index (the uid array)")


def test_group_ids_of_a_bfloat16_tensor_and_of_a_list():
    assert groups.group_ids(torch.tensor([2.0, 2.0, 5.0], dtype=torch.bfloat16), 3)[0].tolist() == [0, 0, 1]
    assert groups.group_ids(["u", "u", "v"], 3)[0].tolist() == [0, 0, 1]
