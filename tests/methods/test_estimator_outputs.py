"""Every registered estimator (``catalog.estimators()``: apo, codapo, agpo, r2po, rarity) through verl's signature,
on the masks and uids verl hands over and on hostile ones: finite advantages of the rewards' shape, or one
``BatchInputError`` line; never NaN or inf out (issue 51, item 4)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recipe_apo.methods import catalog, driver_state
from recipe_apo.methods.agpo.estimator import agpo_outcome_advantage
from recipe_apo.methods.apo.anchor import reset_driver_anchors
from recipe_apo.methods.base import load
from recipe_apo.methods.errors import BatchInputError

ESTIMATORS = sorted(catalog.estimators())
# verl's masks: attention-mask slices (int64), bool, and the float dtypes a model may run in.
MASK_DTYPES = [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float16, torch.bfloat16, torch.float32,
               torch.float64]
REWARD_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64]
# Rewards at the edges of each dtype's range, and the usual ones.
EXTREMES = [0.0, 1.0, -1.0, 0.5, 6e4, -6e4, 65504.0, 3.3e38, -3.3e38, 3.4e38, -3.4e38, 1e308, -1e308, 1.7e308]
# Settings that let every reward through to the maths (APO's binary success refuses rewards outside [0, 1]).
CONFIG = {"apo": {"success": "threshold", "success_threshold": 0.0}, "agpo": {"wrong_reward": 0}}


@contextlib.contextmanager
def estimator_context(name: str, width: int, rows: int, phase: int):
    """What the recipe's trainer hands each estimator beside verl's arguments."""
    reset_driver_anchors()
    if name == "r2po":
        driver_state.keep("r2po", phase)
    try:
        with driver_state.handed(old_log_probs=torch.full((rows, width), -0.1)):
            yield
    finally:
        driver_state.forget("r2po")
        reset_driver_anchors()


def call(name: str, rewards: torch.Tensor, mask: torch.Tensor, index, norm: bool = True, phase: int = 1):
    function = load(catalog.estimators()[name])
    with estimator_context(name, rewards.shape[1], rewards.shape[0], phase):
        advantages, returns = function(rewards, mask, config=dict(CONFIG, norm_adv_by_std_in_grpo=norm), index=index)
    return advantages


def index_of(labels: list[int], kind: str):
    if kind == "object_str":  # verl 0.9.1: np.array(uids.tolist(), dtype=object) of uuid strings
        return np.array([f"uid-{g}" for g in labels], dtype=object)
    if kind == "int":
        return np.array(labels, dtype=np.int64)
    if kind == "list":
        return [f"uid-{g}" for g in labels]
    if kind == "tensor":
        return torch.tensor(labels)
    if kind == "lists":  # one list per response: no uid
        return [[g] * (1 + g % 2) for g in labels]
    raise AssertionError(kind)


rows_strategy = st.lists(
    st.tuples(st.integers(0, 3),  # the group
              st.integers(0, 3),  # the response's length in tokens (0: verl's padding row)
              st.sampled_from(EXTREMES)),  # its reward, on its last valid token
    min_size=1, max_size=10,
)


@hsettings(max_examples=250, deadline=None)
@given(rows=rows_strategy, name=st.sampled_from(ESTIMATORS), reward_dtype=st.sampled_from(REWARD_DTYPES),
       mask_dtype=st.sampled_from(MASK_DTYPES), index_kind=st.sampled_from(["object_str", "int", "list", "tensor",
                                                                            "lists"]),
       corrupt=st.sampled_from([None, float("nan"), float("inf"), 2.0, -1.0]), norm=st.booleans(),
       phase=st.sampled_from([0, 1]))
# Finite rewards whose differences leave the dtype (float32, float16) or float64's sums (1.7e308 + 1.7e308).
@example(rows=[(0, 1, 3.4e38), (0, 1, -3.4e38), (0, 2, -3.4e38)], name="agpo", reward_dtype=torch.float32,
         mask_dtype=torch.int64, index_kind="object_str", corrupt=None, norm=False, phase=1)
@example(rows=[(0, 1, 6e4), (0, 1, -6e4), (0, 2, -6e4), (1, 1, 1.0)], name="agpo", reward_dtype=torch.float16,
         mask_dtype=torch.bool, index_kind="list", corrupt=None, norm=False, phase=1)
@example(rows=[(0, 1, 1.7e308), (0, 1, 1.7e308), (0, 2, -1e308)], name="r2po", reward_dtype=torch.float64,
         mask_dtype=torch.float64, index_kind="int", corrupt=None, norm=True, phase=1)
def test_finite_advantages_or_one_line_never_nan_or_inf(rows, name, reward_dtype, mask_dtype, index_kind, corrupt,
                                                        norm, phase):
    width = 3
    rewards = torch.zeros(len(rows), width, dtype=torch.float64)
    mask = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, (_, length, reward) in enumerate(rows):
        mask[i, :length] = 1.0
        rewards[i, max(length, 1) - 1] = reward
    if reward_dtype.is_floating_point and not torch.isfinite(rewards.to(reward_dtype)).all():
        return  # a reward its dtype cannot hold is not a finite input
    if not reward_dtype.is_floating_point and (rewards.abs() > 2**62).any():
        return
    rewards = rewards.to(reward_dtype)
    if corrupt is not None and (mask_dtype.is_floating_point or np.isfinite(corrupt)) and mask_dtype != torch.bool \
            and not (mask_dtype == torch.uint8 and corrupt < 0):
        mask[0, 0] = corrupt
    else:
        corrupt = None
    mask = mask.to(mask_dtype)
    index = index_of([g for g, _, _ in rows], index_kind)
    try:
        advantages = call(name, rewards, mask, index, norm, phase)
    except BatchInputError as refused:
        message = str(refused)
        assert message and "\n" not in message
        return
    assert corrupt is None, f"a mask holding {corrupt} was accepted"
    assert index_kind != "lists", "a uid that is a list was accepted"
    assert advantages.shape == rewards.shape
    assert advantages.dtype == (reward_dtype if reward_dtype.is_floating_point else torch.float32)
    assert torch.isfinite(advantages).all(), advantages
    assert (advantages[mask.to(torch.float64).sum(dim=-1) == 0] == 0).all()  # padding rows get 0


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
def test_every_mask_dtype_verl_hands_over_gives_the_float32_masks_advantages(name, mask_dtype):
    """0/1 masks are exact in every dtype: each gives what the float32 mask gives, to the bit."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [0, 0]], dtype=torch.float32)
    index = np.array(["a", "a", "b", "b", "pad"], dtype=object)
    expected = call(name, rewards, mask, index)
    torch.testing.assert_close(call(name, rewards, mask.to(mask_dtype), index), expected, rtol=0, atol=0)
    torch.testing.assert_close(call(name, rewards, mask, index.tolist()), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_nan_in_the_mask_is_refused_naming_the_estimator_and_the_row(name):
    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    mask = torch.ones(4, 1)
    mask[2, 0] = float("nan")
    prefix = "r2po" if name == "rarity" else name
    with pytest.raises(BatchInputError) as refused:
        call(name, rewards, mask, np.array(["a", "a", "b", "b"], dtype=object))
    assert str(refused.value) == (
        f"{prefix}: response_mask: 1 of 4 responses have a mask value that is NaN, inf or outside [0, 1], first rows "
        "[2] (row 2 holds nan); a mask is 0 or 1 per token")


@pytest.mark.parametrize("index, said", [
    ([["a"], ["a", "b"], ["c"], ["c"]], "the uid of row 0 is a list, which cannot name a group"),
    ([{"u": 1}, {"u": 1}, {"u": 2}, {"u": 2}], "the uid of row 0 is a dict, which cannot name a group"),
    ([["a"], ["a"], ["b"], ["b"]], "has shape (4, 1) but the batch has 4 responses"),
])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_an_index_that_is_not_one_uid_per_response_is_one_line(name, index, said):
    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    with pytest.raises(BatchInputError) as refused:
        call(name, rewards, torch.ones(4, 1), index)
    assert said in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith("index (the uid array)")


def test_agpo_without_the_std_on_float32_rewards_near_their_max_is_refused_not_inf():
    """Group a: 3.4e38, -3.4e38, -3.4e38 (mean -1.13e38): the first response's reward difference, 4.53e38, is finite
    in float64 and past float32's max 3.40e38."""
    rewards = torch.tensor([[3.4e38], [-3.4e38], [-3.4e38], [1.0], [0.0]])
    with pytest.raises(BatchInputError) as refused:
        call("agpo", rewards, torch.ones(5, 1), np.array(["a", "a", "a", "b", "b"], dtype=object), norm=False)
    assert str(refused.value).startswith(
        "agpo: the advantages of 1 of 5 responses are not finite in float32 (max 3.4e+38), first row 0 (advantage "
        "4.533e+38 in float64): rescale the rewards")


def test_agpo_on_float16_rewards_near_6e4_is_refused_not_inf():
    """60000 is exact in float16; the first response's difference from the mean -20000 is 80000 > 65504."""
    rewards = torch.tensor([[6e4], [-6e4], [-6e4], [0.0]], dtype=torch.float16)
    with pytest.raises(BatchInputError, match=r"^agpo: the advantages of 1 of 4 responses are not finite in float16 "
                                              r"\(max 6\.55e\+04\), first row 0 \(advantage 8e\+04 in float64\)"):
        call("agpo", rewards, torch.ones(4, 1), np.array(["a", "a", "a", "b"], dtype=object), norm=False)


def test_agpos_estimator_takes_a_bf16_mask_and_records_its_rows():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bfloat16)
    advantages, _ = agpo_outcome_advantage(rewards, mask, config={}, index=np.array(["a", "a", "pad"], dtype=object))
    # wrong_reward=-1: R~ = (1, -1), mean 0, sample std sqrt(2): A = +-1 / (sqrt(2) + 1e-6) on valid tokens.
    a = 1.0 / (2.0 ** 0.5 + 1e-6)
    torch.testing.assert_close(advantages, torch.tensor([[a, a], [-a, 0.0], [0.0, 0.0]]))
    assert driver_state.last_result("agpo").per_response["valid"].tolist() == [True, True, False]


def test_apo_names_itself_and_the_response_whose_advantage_would_overflow():
    rewards = torch.tensor([[1.0], [0.0], [3e38], [-3e38], [-3e38]])
    with pytest.raises(BatchInputError) as refused:
        call("apo", rewards, torch.ones(5, 1), np.array(["a", "a", "b", "b", "b"], dtype=object))
    # Group b's mean is -1e38: response 2's centered reward is 4e38.
    assert str(refused.value) == (
        "apo: advantages would overflow float32 (max 3.4e+38): response 2's group-centered reward 4e+38 x "
        "algorithm.apo.lambda_scale=1.5 x e bounds its advantage; lower lambda_scale or rescale the rewards")
