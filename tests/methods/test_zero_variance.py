"""AGPO's zero-variance denominator: the step scale worked by hand, exactness against verl's own ``agg_loss``
with the dead responses masked out, and the error of the step scale when mini-batches differ."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import agg_loss

from recipe_apo.methods.errors import BatchInputError, MethodConfigError
from recipe_apo.methods.zero_variance.rescale import (
    check_mode,
    denominator_ratio,
    exclude_zero_variance,
    live_rows,
    zero_variance_scale,
)


def hand_batch():
    """Group a: rewards 1, 0 (lengths 2, 2): live. Group b: 1, 1 (lengths 1, 5): dead. One padding row."""
    lengths = [2, 2, 1, 5, 0]
    mask = (torch.arange(5).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    rewards = torch.zeros(5, 5)
    for row, reward in enumerate([1.0, 0.0, 1.0, 1.0]):
        rewards[row, lengths[row] - 1] = reward
    advantages = torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0]).unsqueeze(-1) * mask
    return advantages, rewards, mask, np.array(["a", "a", "b", "b", "pad"], dtype=object)


@pytest.mark.parametrize(
    "mode, scale, share",
    [
        # B = 5 rows as verl's global_batch_size counts them (the padding row too), 2 dead: B_live = 3. Live
        # share: 2 of the 4 valid responses.
        ("seq-mean-token-sum-norm", 5 / 3, 2 / 4),
        ("seq-mean-token-mean", 5 / 3, 2 / 4),
        ("token-mean", 10 / 4, 4 / 10),  # T = 10 valid tokens, 4 live (the padding row has none)
    ],
)
def test_the_step_scale_worked_by_hand(mode, scale, share):
    advantages, rewards, mask, uid = hand_batch()
    scaled, metrics = exclude_zero_variance(advantages, rewards, mask, uid, mode)
    assert metrics == {"zero_variance/live_share": share, "zero_variance/scale": scale}
    torch.testing.assert_close(scaled, advantages * scale)


def test_liveness_compares_rewards_not_centered_values():
    scores = np.array([0.1 + 0.2, 0.3, 0.7, 0.7, 0.7, 5.0])
    valid = np.array([True, True, True, True, True, False])
    # 0.1 + 0.2 != 0.3 in floats: that group is live; the 0.7 group is dead whatever its mean rounds to; the
    # padding row is never live.
    assert live_rows(scores, valid, np.array([0, 0, 1, 1, 1, 2])).tolist() == [True, True, False, False, False, False]


def test_with_multi_output_trajectories_the_final_outputs_decide_and_every_output_row_counts():
    """Group a: trajectory 1 has outputs (rows 0, 1), final reward 1; trajectory 2 one output (row 2), reward 0.
    Group b: two one-output trajectories with reward 0 (rows 3, 4), but row 5, an earlier output of b's
    second trajectory scored apart, has reward 1: b is dead on its outcomes. Rows: B = 6, B_live = 3."""
    lengths = [2, 1, 3, 1, 2, 2]
    mask = (torch.arange(3).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    rewards = torch.zeros(6, 3)
    for row, reward in enumerate([0.0, 1.0, 0.0, 0.0, 0.0, 1.0]):
        rewards[row, lengths[row] - 1] = reward
    uid = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    final = np.array([False, True, True, True, True, False])
    scale, live, metrics = zero_variance_scale(rewards, mask, uid, "seq-mean-token-sum-norm", final)
    assert live.tolist() == [True, True, True, False, False, False] and scale == 6 / 3
    scale, _, _ = zero_variance_scale(rewards, mask, uid, "token-mean", final)
    assert scale == 11 / 6
    # Every row deciding, b's stray reward would make it live.
    assert zero_variance_scale(rewards, mask, uid, "seq-mean-token-sum-norm")[1].all()


def test_a_step_without_signal_keeps_scale_one():
    advantages, rewards, mask, uid = hand_batch()
    scale, live, metrics = zero_variance_scale(rewards[2:4], mask[2:4], uid[2:4], "token-mean")
    assert scale == 1.0 and not live.any() and metrics["zero_variance/live_share"] == 0.0


def test_modes_without_a_denominator_and_unknown_modes_are_refused():
    with pytest.raises(ValueError, match="loss_agg_mode=token-sum: that mode has no denominator"):
        check_mode("exclude", "token-sum")
    with pytest.raises(ValueError, match="algorithm.zero_variance must be one of keep, exclude"):
        check_mode("exact", "token-mean")
    assert check_mode("keep", "token-sum") == "keep"


MODES = ("seq-mean-token-sum-norm", "seq-mean-token-mean", "seq-mean-token-sum", "token-mean")


@settings(max_examples=80, deadline=None)
@given(groups=st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=6), data=st.data(),
       mode=st.sampled_from(MODES), padding=st.integers(0, 3))
def test_one_mini_batch_equals_verls_loss_with_the_dead_responses_masked_out(groups, data, mode, padding):
    """With one mini-batch per step, exclude is exact: verl's agg_loss of the scaled advantages over all rows
    equals agg_loss of the advantages with the dead responses out: masked, and out of the denominators. verl's
    padding rows (no valid token, all under one made-up uid) stay as verl counts them: in global_batch_size,
    with no tokens."""
    sizes = [size for size, _ in groups]
    n, width = sum(sizes), 6
    index = np.repeat(np.arange(len(sizes)), sizes).astype(object)
    lengths = torch.tensor(data.draw(st.lists(st.integers(1, width), min_size=n, max_size=n)) + [0] * padding)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    rewards_per_row = []
    for size, alive in groups:
        rewards_per_row += ([1.0] + [0.0] * (size - 1)) if alive and size > 1 else [float(alive)] * size
    rewards = torch.zeros(n + padding, width, dtype=torch.float64)
    rewards[torch.arange(n), lengths[:n] - 1] = torch.tensor(rewards_per_row, dtype=torch.float64)
    index = np.concatenate([index, np.array(["pad"] * padding, dtype=object)])
    valid = np.arange(n + padding) < n
    # Any advantages on live rows; the dead rows' are 0, as every centered estimator gives them.
    raw = torch.tensor(data.draw(st.lists(st.floats(-3, 3), min_size=n, max_size=n)) + [0.0] * padding,
                       dtype=torch.float64)
    live = torch.from_numpy(live_rows(rewards.sum(-1).numpy(), valid, index))
    advantages = (raw * live).unsqueeze(-1) * mask.double()
    scaled, _ = exclude_zero_variance(advantages, rewards, mask, index, mode)
    L0 = 7.0
    ours = agg_loss(-scaled, mask, mode, global_batch_size=n + padding, batch_num_tokens=mask.sum(),
                    loss_scale_factor=L0)
    live_mask = mask * live.unsqueeze(-1)
    if not live.any():
        assert ours == 0.0
        return
    exact = agg_loss(-advantages, live_mask, mode, global_batch_size=int(live.sum()) + padding,
                     batch_num_tokens=live_mask.sum(), loss_scale_factor=L0)
    torch.testing.assert_close(ours, exact, rtol=1e-9, atol=1e-12)


def test_with_two_mini_batches_of_different_live_shares_each_is_off_by_its_share_over_the_steps():
    # 8 responses of equal length; mini-batch 0 = rows 0-3 with 2 live, mini-batch 1 = rows 4-7 all live.
    live = np.array([True, True, False, False, True, True, True, True])
    tokens = np.full(8, 3.0)
    # Step live share 6/8: mini-batch 0 (share 1/2) gets (1/2) / (3/4) = 2/3 of its exact loss, mini-batch 1 4/3.
    assert denominator_ratio(live, np.arange(4), tokens, "seq-mean-token-sum-norm") == pytest.approx(2 / 3)
    assert denominator_ratio(live, np.arange(4, 8), tokens, "seq-mean-token-sum-norm") == pytest.approx(4 / 3)
    # Token-mean weighs by tokens: lengths 1, 1, 6, 6 | 2, 2, 2, 2 -> step 10/22, mini-batch 0 2/14.
    tokens = np.array([1, 1, 6, 6, 2, 2, 2, 2], dtype=float)
    assert denominator_ratio(live, np.arange(4), tokens, "token-mean") == pytest.approx((2 / 14) / (10 / 22))
    # The whole step as one mini-batch: exact.
    assert denominator_ratio(live, np.arange(8), tokens, "token-mean") == pytest.approx(1.0)


@pytest.mark.parametrize("loss_mode, mode", [("vanilla", "seq-mean-token-sum-norm"), ("apo", "seq-mean-token-sum-norm"),
                                             ("vanilla", "token-mean"), ("vanilla", "seq-mean-token-mean")])
def test_off_policy_the_registered_losses_see_the_scale_as_the_exact_denominator(loss_mode, mode):
    """Ratios far from 1, clipped and gated: verl's vanilla loss (dual clip) and the apo gate are positively
    homogeneous in A, so the scaled advantages over all responses give the loss, and the gradient, of the
    unscaled ones over the live responses with live denominators."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators and losses)

    advantages, rewards, mask, uid = hand_batch()
    advantages = advantages * 3.0
    live = torch.tensor([True, True, False, False, False])
    generator = torch.Generator().manual_seed(0)
    old_log_prob = -torch.rand(mask.shape, generator=generator)

    def loss(adv, loss_mask, responses, tokens):
        config = FSDPActorConfig(strategy="fsdp2", rollout_n=2, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=mode,
                                 loss_scale_factor=5 if mode == "seq-mean-token-sum-norm" else None,
                                 policy_loss=PolicyLossConfig(loss_mode=loss_mode))
        config.global_batch_info.update(dp_size=1, global_batch_size=responses, batch_num_tokens=tokens,
                                        loss_scale_factor=config.loss_scale_factor)
        log_prob = (old_log_prob + torch.linspace(-0.9, 0.9, mask.numel()).view(mask.shape)).requires_grad_(True)
        value, _ = get_policy_loss_fn(loss_mode)(old_log_prob=old_log_prob, log_prob=log_prob, advantages=adv,
                                                 response_mask=loss_mask, loss_agg_mode=mode, config=config,
                                                 rollout_is_weights=None)
        value.backward()
        return value.detach(), log_prob.grad

    scaled, _ = exclude_zero_variance(advantages, rewards, mask, uid, mode)
    # verl's global_batch_size counts the padding row (5 rows); the dead group's 2 responses leave it.
    ours = loss(scaled, mask, 5, int(mask.sum()))
    live_mask = mask * live.unsqueeze(-1)
    exact = loss(advantages, live_mask, 3, int(live_mask.sum()))
    torch.testing.assert_close(ours[0], exact[0])
    torch.testing.assert_close(ours[1], exact[1])


# ---- settings and refusals -----------------------------------------------------------------------------------------
def test_a_misspelt_aggregation_mode_is_named_with_verls_modes():
    with pytest.raises(MethodConfigError) as info:
        check_mode("exclude", "tokenmean")
    assert str(info.value) == (
        "actor_rollout_ref.actor.loss_agg_mode=tokenmean is not one of verl's modes: token-mean, token-sum, "
        "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm"
    )


@pytest.mark.parametrize("mode", [True, None, "Exclude", 1, ["exclude"]])
def test_every_value_of_the_setting_is_checked_with_its_type(mode):
    with pytest.raises(MethodConfigError, match=r"^algorithm.zero_variance must be one of keep, exclude, got "):
        check_mode(mode, "token-mean")


def test_exclude_with_the_kl_penalty_in_the_reward_is_refused():
    """verl's apply_kl_penalty centres score - beta * KL: a group whose scores are all equal still carries
    advantages, so deciding "dead" on the scores would rescale the wrong responses (and on the penalised rewards
    no group would ever be dead)."""
    with pytest.raises(MethodConfigError) as info:
        check_mode("exclude", "token-mean", use_kl_in_reward=True)
    message = str(info.value)
    assert message.startswith("algorithm.zero_variance=exclude with algorithm.use_kl_in_reward=true: ")
    assert "actor_rollout_ref.actor.use_kl_loss=true" in message and "\n" not in message
    assert check_mode("keep", "token-mean", use_kl_in_reward=True) == "keep"
    assert check_mode("exclude", "token-mean", use_kl_in_reward=False) == "exclude"


def test_a_refused_batch_leaves_the_callers_advantages_as_they_were():
    advantages, rewards, mask, uid = hand_batch()
    before = advantages.clone()
    rewards[0, 0] = float("nan")
    with pytest.raises(BatchInputError, match="NaN/inf rewards"):
        exclude_zero_variance(advantages, rewards, mask, uid, "token-mean")
    assert torch.equal(advantages, before)


def test_scaled_advantages_that_would_overflow_are_refused_naming_the_scale():
    # Group a live (+-2.1e38, finite in float32), group b dead: seq-mean scale 5 / 3, and 3.5e38 is past float32's
    # 3.4e38. Today's code returned inf.
    advantages, rewards, mask, uid = hand_batch()
    advantages = torch.tensor([2.1e38, -2.1e38, 0.0, 0.0, 0.0]).unsqueeze(-1) * mask
    with pytest.raises(BatchInputError) as info:
        exclude_zero_variance(advantages, rewards, mask, uid, "seq-mean-token-mean")
    assert str(info.value) == (
        "algorithm.zero_variance=exclude: the scaled advantages would overflow float32 (max 3.4e+38): the largest "
        "advantage 2.1e+38 x the step's scale 1.67; rescale the rewards"
    )
    # Half of it fits.
    scaled, _ = exclude_zero_variance(advantages / 2, rewards, mask, uid, "seq-mean-token-mean")
    assert scaled[0, 0].item() == (advantages[0, 0] / 2 * torch.tensor(5 / 3)).item()
