"""The helpers the methods share (groups, settings, errors, tensors) and the estimator's padding-row shortcut."""

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recipe_apo.errors import RecipeError
from recipe_apo.methods import apo, apo_settings, codapo, errors, groups, settings, success, tensors
from recipe_apo.methods.apo_settings import ApoConfigError, ApoSettings
from recipe_apo.methods.codapo import CodapoConfigError, CodapoSettings
from recipe_apo.methods.errors import ApoInputError, BatchInputError, MethodConfigError


def test_errors_are_recipe_errors_and_value_errors_under_their_old_names_too():
    assert issubclass(BatchInputError, RecipeError) and issubclass(BatchInputError, ValueError)
    assert issubclass(MethodConfigError, RecipeError) and issubclass(MethodConfigError, ValueError)
    assert ApoInputError is BatchInputError
    assert success.ApoInputError is apo.ApoInputError is errors.ApoInputError is BatchInputError
    assert issubclass(ApoConfigError, MethodConfigError) and issubclass(CodapoConfigError, MethodConfigError)
    with pytest.raises(MethodConfigError, match="algorithm.apo.eta"):
        ApoSettings.from_algorithm_config({"apo": {"eta": -1.0}})
    with pytest.raises(MethodConfigError, match="algorithm.codapo.percentile"):
        CodapoSettings.from_algorithm_config({"codapo": {"percentile": 2.0}})


def test_moved_helpers_stay_importable_from_their_old_modules():
    assert apo_settings.read_settings is settings.read_settings
    assert apo.group_ids is groups.group_ids and apo.response_rewards is groups.response_rewards
    assert codapo.read_settings is settings.read_settings


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_empty_like_is_torchs_empty_like(dtype):
    for like in (torch.ones(3, 5, dtype=torch.int64), torch.ones(5, 3, dtype=torch.int64).t(),
                 torch.ones(6, 1 << 21, dtype=torch.int8)):
        out = tensors.empty_like(like, dtype)
        assert out.dtype == dtype and out.shape == like.shape
        assert out.stride() == torch.empty_like(like, dtype=dtype).stride()
        assert torch.equal(out.copy_(like), like.to(dtype))


def test_empty_like_hints_huge_pages_for_the_aligned_inside_of_a_large_tensor_only(monkeypatch):
    import mmap

    calls = []
    monkeypatch.setattr(tensors, "_MADVISE", lambda start, length, advice: calls.append((start, length, advice)))
    tensors.empty_like(torch.ones(4, 4, dtype=torch.int8), torch.float32)
    assert calls == []
    out = tensors.empty_like(torch.ones(5, 1 << 22, dtype=torch.int8), torch.float32)  # 80 MiB
    (start, length, advice), = calls
    end = out.data_ptr() + out.numel() * out.element_size()
    huge = 2 << 20
    assert advice == mmap.MADV_HUGEPAGE and start % huge == 0 and length % huge == 0
    assert out.data_ptr() <= start and start + length <= end and length >= end - out.data_ptr() - 2 * huge
