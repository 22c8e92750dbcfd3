"""The estimator under unusual or hostile inputs: reward dtypes, overflow, empty batches, missing data sources."""


import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from recipe_apo.methods.apo.anchor import AnchorBook, CapabilityAnchor
from recipe_apo.methods.apo.estimator import compute_apo_advantage
from recipe_apo.methods.apo.settings import MAX_HISTORY, MAX_LAMBDA_SCALE, ApoConfigError, ApoSettings
from recipe_apo.methods.errors import BatchInputError

DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
          torch.float16, torch.bfloat16, torch.float32, torch.float64]

batches = st.lists(
    st.tuples(st.integers(min_value=0, max_value=4), st.integers(min_value=0, max_value=1),
              st.integers(min_value=1, max_value=5)),
    min_size=1, max_size=30,
)


def token_rewards_of(rewards, lengths, dtype, width=5):
    """Each response's reward on its last valid token, in ``dtype``; mask in float32."""
    token_rewards = torch.zeros(len(rewards), width, dtype=torch.float64)
    mask = torch.zeros(len(rewards), width)
    for i, (reward, length) in enumerate(zip(rewards, lengths)):
        mask[i, :length] = 1
        token_rewards[i, length - 1] = reward
    return token_rewards.to(dtype), mask


@hsettings(max_examples=60, deadline=None)
@given(batch=batches, dtype=st.sampled_from(DTYPES), anchor_init=st.floats(0.0, 1.0))
def test_any_numeric_dtype_of_rewards_gives_the_float64_advantages(batch, dtype, anchor_init):
    """0/1 rewards are exact in every dtype, so every dtype must give float64's advantages, in a real dtype."""
    groups = np.array([f"g{g}" for g, _, _ in batch], dtype=object)
    rewards, lengths = [r for _, r, _ in batch], [n for _, _, n in batch]
    cfg = ApoSettings(anchor_init=anchor_init)
    reference_rewards, mask = token_rewards_of(rewards, lengths, torch.float64)
    reference_anchor, anchor = CapabilityAnchor(anchor_init), CapabilityAnchor(anchor_init)
    reference, _ = compute_apo_advantage(reference_rewards, mask, groups, cfg, reference_anchor)
    token_rewards, _ = token_rewards_of(rewards, lengths, dtype)
    advantages, _ = compute_apo_advantage(token_rewards, mask, groups, cfg, anchor)

    expected_dtype = dtype if dtype.is_floating_point else torch.float32
    assert advantages.dtype == expected_dtype
    torch.testing.assert_close(advantages, reference.to(expected_dtype), rtol=0, atol=0)
    assert anchor.state_dict() == reference_anchor.state_dict()


def test_integer_rewards_are_not_truncated_to_zero_and_bool_rewards_keep_their_sign():
    mask = torch.ones(4, 2)
    for dtype in (torch.int64, torch.bool):
        token_rewards = torch.tensor([[0, 1], [0, 0], [0, 0], [0, 1]]).to(dtype)
        advantages, _ = compute_apo_advantage(token_rewards, mask, np.array(["a", "a", "b", "b"]),
                                              ApoSettings(anchor_init=0.5), CapabilityAnchor(0.5))
        # Both groups have p_hat = 0.5 = C: Phi = lambda_scale = 1.5 and A = +-0.5.
        torch.testing.assert_close(advantages[:, 0], torch.tensor([0.75, -0.75, -0.75, 0.75]))


@hsettings(max_examples=80, deadline=None)
@given(
    rewards=st.lists(st.floats(min_value=-1e300, max_value=1e300), min_size=2, max_size=12),
    lambda_scale=st.floats(min_value=1e-6, max_value=MAX_LAMBDA_SCALE),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
)
def test_accepted_settings_on_finite_rewards_give_finite_advantages_or_a_clear_error(rewards, lambda_scale, dtype):
    token_rewards = torch.tensor(rewards, dtype=torch.float64).unsqueeze(-1)
    if not torch.isfinite(token_rewards.to(dtype)).all():
        return  # the reward itself does not fit the dtype: not a finite input
    token_rewards = token_rewards.to(dtype)
    groups = np.array(["g"] * len(rewards), dtype=object)
    anchor = CapabilityAnchor(0.5)
    cfg = ApoSettings(lambda_scale=lambda_scale, success="threshold", success_threshold=0.0)
    try:
        advantages, _ = compute_apo_advantage(token_rewards, torch.ones_like(token_rewards), groups, cfg, anchor)
    except BatchInputError as error:
        assert "would overflow" in str(error) and "algorithm.apo.lambda_scale" in str(error)
        assert anchor.state_dict() == CapabilityAnchor(0.5).state_dict()
    else:
        assert torch.isfinite(advantages).all()


def test_an_overflowing_advantage_is_refused_before_the_anchor_moves():
    token_rewards = torch.tensor([[3e38], [0.0]])
    anchor = CapabilityAnchor(0.5)
    with pytest.raises(BatchInputError, match=r"advantages would overflow float32 .*lambda_scale=1\.5"):
        compute_apo_advantage(token_rewards, torch.ones(2, 1), np.array(["g", "g"]),
                              ApoSettings(success="threshold"), anchor)
    assert anchor.steps == 0 and anchor.value == 0.5


@pytest.mark.parametrize("apo_node, key", [
    ({"lambda_scale": 1e308}, "lambda_scale"),
    ({"lambda_scale": MAX_LAMBDA_SCALE * 1.01}, "lambda_scale"),
    ({"history": 10**20}, "history"),
    ({"history": MAX_HISTORY + 1}, "history"),
    ({"history": 2.5}, "history"),
])
def test_settings_that_could_overflow_are_refused_naming_the_key(apo_node, key):
    with pytest.raises(ApoConfigError) as info:
        ApoSettings.from_algorithm_config(OmegaConf.create({"apo": apo_node}))
    assert f"algorithm.apo.{key}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (4, 0)])
def test_empty_batches_give_empty_real_advantages_and_leave_the_anchor_alone(shape):
    anchor = CapabilityAnchor(0.3)
    uids = np.array([f"u{i // 2}" for i in range(shape[0])], dtype=object)
    for dtype in (torch.int64, torch.float32):
        advantages, metrics = compute_apo_advantage(torch.zeros(shape, dtype=dtype), torch.zeros(shape), uids,
                                                    ApoSettings(), anchor)
        assert advantages.shape == shape and advantages.dtype == torch.float32 and metrics == {}
    assert anchor.steps == 0 and anchor.value == 0.3


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_a_missing_data_source_is_named_with_its_rows(missing):
    token_rewards, mask = token_rewards_of([1, 0, 1, 0], [1, 1, 1, 1], torch.float32)
    book = AnchorBook(init=0.5)
    message = r"data_source is missing \(None/NaN\) for 2 of 4 responses, first rows \[2, 3\]"
    with pytest.raises(BatchInputError, match=message):
        compute_apo_advantage(token_rewards, mask, np.array(["a", "a", "b", "b"]), ApoSettings(), book,
                              scopes=np.array(["math", "math", missing, missing], dtype=object))
    assert book.anchors == {}


def test_every_refused_batch_leaves_every_anchor_of_the_book_as_it_was():
    """A refusal comes before any anchor moves, with one anchor per data source too: the book's whole state is
    equal before and after, and a scope the refused batch named is not created."""
    from recipe_apo.methods.apo.anchor import AnchorBook

    settings = ApoSettings(anchor_scope="data_source", history=5)
    book = AnchorBook(init=0.3, history=5)
    good, mask = token_rewards_of([1, 0, 0, 0], [2, 2, 2, 2], torch.float32)
    compute_apo_advantage(good, mask, np.array([0, 0, 1, 1]), settings, book, np.array(["x", "x", "y", "y"]))
    before = book.state_dict()
    nan = good.clone()
    nan[1, 0] = float("nan")
    out_of_range = good * 2.0  # binary success needs rewards in [0, 1]
    huge = torch.tensor([[3e38, 0.0], [-3e38, 0.0], [0.0, 0.0], [0.0, 0.0]])
    refusals = [
        (nan, np.array([0, 0, 1, 1]), ["x", "x", "z", "z"]),
        (out_of_range, np.array([0, 0, 1, 1]), ["x", "x", "z", "z"]),
        (huge, np.array([0, 0, 1, 1]), ["z", "z", "y", "y"]),
        (good, np.array([0, 0, 0, 1]), ["x", "x", "z", "z"]),  # a group across two sources
        (good, np.array([0, 0, None, 1], dtype=object), ["x", "x", "z", "z"]),  # a missing uid
        (good, np.array([0, 0, 1, 1]), ["x", None, "z", "z"]),  # a missing data source
    ]
    for rewards, index, scopes in refusals:
        with pytest.raises(BatchInputError):
            compute_apo_advantage(rewards, mask, index, settings, book, np.array(scopes, dtype=object))
        assert book.state_dict() == before and "z" not in book.anchors
