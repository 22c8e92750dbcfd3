"""AGPO as its authors built it: the training rewards and advantages on a batch worked by hand and against the
authors' per-response loops (re-written here as their code reads, verl pull request #2649 at 4cbea10: the reward
manager's length bonus, ``compute_agpo_outcome_advantage``), the loss's value and gradient (its mask and its clip
at 0) against verl's vanilla loss, the settings and the launch checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.agpo_reference import authors_advantages, authors_shaped
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from recipe_apo.methods.agpo.estimator import agpo_outcome_advantage, compute_agpo_advantage
from recipe_apo.methods.agpo.launch import check_rewards
from recipe_apo.methods.agpo.loss import compute_policy_loss_agpo
from recipe_apo.methods.agpo.settings import AgpoConfigError, AgpoSettings
from recipe_apo.methods.base import Launch
from recipe_apo.methods.errors import MethodConfigError


def batch(lengths, rewards, uids, width=6):
    """Token-level rewards (the reward on the last valid token, as verl puts it), the mask, the uids."""
    mask = torch.zeros(len(lengths), width)
    token_rewards = torch.zeros(len(lengths), width)
    for row, (length, reward) in enumerate(zip(lengths, rewards)):
        mask[row, :length] = 1
        if length:
            token_rewards[row, length - 1] = reward
    return token_rewards, mask, np.array(uids, dtype=object)


# --- by hand -----------------------------------------------------------------------------------------------------

def test_a_batch_worked_by_hand():
    """Group a: right answers of 2 and 4 tokens, a wrong one: shaped 1.1, 1.0, 0 (mean 0.7, sample std
    sqrt(0.37)). Group b: all right (no bonus: +1). Group c: all wrong (-1). Group d: alone (mean 0, std 1)."""
    rewards, mask, uids = batch([2, 4, 3, 5, 1, 2, 3, 2], [1, 1, 0, 1, 1, 0, 0, 1],
                                ["a", "a", "a", "b", "b", "c", "c", "d"])
    advantages, rows = compute_agpo_advantage(rewards, mask, uids)
    std = np.sqrt(0.37)
    expected = [0.4 / (std + 1e-6), 0.3 / (std + 1e-6), -0.7 / (std + 1e-6), 1.0, 1.0, -1.0, -1.0, 1.0 / (1 + 1e-6)]
    assert advantages[:, 0].tolist() == pytest.approx(expected, rel=1e-6)
    # every valid token gets its response's advantage, padding gets 0
    assert torch.equal(advantages, advantages[:, :1] * mask)
    assert rows["shaped"].tolist() == pytest.approx([1.1, 1.0, 0, 1, 1, 0, 0, 1], rel=1e-7)
    assert rows["bonused"].tolist() == [True, True, False, False, False, False, False, False]
    assert rows["saturated"].tolist() == [0, 0, 0, 1, 1, -1, -1, 0]


def test_the_bonus_runs_from_the_shortest_to_the_longest_correct_response():
    """Lengths 2, 3, 6 right and one wrong: 1 + 0.1 (1 - (L - 2) / 4) = 1.1, 1.075, 1.0; the wrong one keeps 0."""
    rewards, mask, uids = batch([2, 3, 6, 1], [1, 1, 1, 0], ["g"] * 4)
    _, rows = compute_agpo_advantage(rewards, mask, uids)
    assert rows["shaped"].tolist() == [np.float32(1.1), np.float32(1.075), 1.0, 0.0]


@pytest.mark.parametrize("lengths, rewards, why", [
    ([2, 4, 3], [1, 1, 1], "all right"),
    ([3, 3, 2], [1, 1, 0], "the right answers have one length"),
    ([3, 2, 5], [1, 0.5, 0], "one right answer"),
    ([3, 2, 5], [0.9, 0.95, 0], "no reward is exactly 1"),
])
def test_no_bonus(lengths, rewards, why):
    reward_tensor, mask, uids = batch(lengths, rewards, ["g"] * 3)
    _, rows = compute_agpo_advantage(reward_tensor, mask, uids, settings=AgpoSettings(length_bonus=0.3))
    assert not rows["bonused"].any(), why
    assert rows["shaped"].tolist() == pytest.approx(rewards)


def test_the_settings_turn_each_piece_off():
    rewards, mask, uids = batch([2, 4, 3, 5, 1], [1, 1, 0, 1, 1], ["a", "a", "a", "b", "b"])
    plain, _ = compute_agpo_advantage(rewards, mask, uids, settings=AgpoSettings(length_bonus=0.0,
                                                                                saturated_signal=False))
    # GRPO: verl's own estimator
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, uids)
    torch.testing.assert_close(plain, grpo, rtol=1e-6, atol=1e-6)
    no_bonus, rows = compute_agpo_advantage(rewards, mask, uids, settings=AgpoSettings(length_bonus=0.0))
    assert not rows["bonused"].any() and no_bonus[3:, 0].tolist() == [1.0, 1.0]
    centred, _ = compute_agpo_advantage(rewards, mask, uids, norm_adv_by_std=False)
    assert centred[:3, 0].tolist() == pytest.approx([1.1 - 0.7, 1.0 - 0.7, -0.7], rel=1e-6)


def test_a_padding_row_takes_no_part():
    rewards, mask, uids = batch([2, 4, 3, 0], [1, 1, 0, 0], ["a", "a", "a", "a"])
    with_padding, rows = compute_agpo_advantage(rewards, mask, uids)
    without, _ = compute_agpo_advantage(rewards[:3], mask[:3], uids[:3])
    assert torch.equal(with_padding[:3], without) and with_padding[3].abs().sum() == 0
    assert rows["shaped"][3] == 0 and not rows["bonused"][3]


def test_integer_rewards_give_float_advantages_and_bad_rewards_are_refused():
    rewards, mask, uids = batch([2, 4, 3], [1, 1, 0], ["a"] * 3)
    advantages, _ = compute_agpo_advantage(rewards.long(), mask, uids)
    assert advantages.dtype == torch.float32
    rewards[0, 1] = float("nan")
    with pytest.raises(ValueError, match="agpo: 1 of 3 responses have NaN/inf rewards"):
        compute_agpo_advantage(rewards, mask, uids)


def test_verls_signature_reads_algorithm_agpo():
    rewards, mask, uids = batch([2, 4, 3], [1, 1, 0], ["a"] * 3)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": False, "agpo": {"length_bonus": 0.0}})
    advantages, returns = agpo_outcome_advantage(rewards, mask, config=config, index=uids)
    assert advantages[:, 0].tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3], rel=1e-6) and returns is advantages
    with pytest.raises(AgpoConfigError, match="unknown setting algorithm.agpo.bonus"):
        agpo_outcome_advantage(rewards, mask, config=OmegaConf.create({"agpo": {"bonus": 1}}), index=uids)
    with pytest.raises(ValueError, match="needs the uid"):
        agpo_outcome_advantage(rewards, mask, config=config)


@pytest.mark.parametrize("key, value, said", [
    ("length_bonus", -0.1, "algorithm.agpo.length_bonus"),
    ("length_bonus", float("nan"), "algorithm.agpo.length_bonus"),
    ("length_bonus", 1e4, "algorithm.agpo.length_bonus"),
    ("length_bonus", "0.1", "algorithm.agpo.length_bonus"),
    ("saturated_signal", 1, "algorithm.agpo.saturated_signal"),
])
def test_bad_settings_are_one_line_naming_the_key(key, value, said):
    with pytest.raises(AgpoConfigError, match=said):
        AgpoSettings.from_algorithm_config({"agpo": {key: value}})


# --- against the authors' loops ----------------------------------------------------------------------------------

@st.composite
def batches(draw):
    groups = draw(st.integers(1, 6))
    size = draw(st.integers(1, 6))
    n = groups * size
    lengths = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    rewards = draw(st.lists(st.sampled_from([0.0, 1.0, 1.0, 0.5]), min_size=n, max_size=n))
    return lengths, rewards, [f"u{i // size}" for i in range(n)], draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(batches())
def test_the_authors_rewards_and_advantages_for_any_batch(case):
    lengths, rewards, uids, norm = case
    reward_tensor, mask, index = batch(lengths, rewards, uids, width=8)
    advantages, rows = compute_agpo_advantage(reward_tensor, mask, index, norm_adv_by_std=norm)
    shaped = authors_shaped(rewards, lengths, uids)
    assert rows["shaped"].astype(np.float32).tolist() == shaped.tolist()  # the same floats
    expected = authors_advantages(shaped, uids, norm)
    # float64 statistics here, float32 in the source
    torch.testing.assert_close(advantages[:, 0], expected, rtol=2e-6, atol=2e-6)


# --- the loss ----------------------------------------------------------------------------------------------------

def actor_config(**kwargs):
    from verl.workers.config import ActorConfig

    fields = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, **kwargs}
    config = ActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **fields)
    return config


def test_the_loss_is_verls_surrogate_over_live_tokens():
    """Two responses of 2 tokens, the second with A = 0. Ratios e^0.1, e^-0.3 (first) against A = 1: the first
    token's ratio is inside [0.8, 1.28], the second clipped at 0.8 from below but with A > 0 PPO keeps the
    smaller objective, -r A: -e^-0.3. Token-mean over the live tokens: (-e^0.1 - e^-0.3) / 2 < 0, clipped to 0."""
    old = torch.zeros(2, 2)
    new = torch.tensor([[0.1, -0.3], [0.5, 0.5]], requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    loss, metrics = compute_policy_loss_agpo(old, new, advantages, mask, "token-mean", actor_config())
    assert loss.item() == 0.0 and metrics["actor/agpo_loss_clipped"] == 1.0
    loss.backward()
    assert new.grad.abs().sum() == 0  # a clipped micro-batch gives no gradient


def test_a_positive_loss_and_its_gradient_against_verls_vanilla_loss_on_the_live_mask():
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    old = torch.zeros(3, 2)
    advantages = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [0.5, 0.5]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    values = torch.tensor([[0.2, -0.1], [0.3, 0.3], [0.0, 0.0]])
    new = values.clone().requires_grad_(True)
    loss, _ = compute_policy_loss_agpo(old, new, advantages, mask, "token-mean", actor_config())
    loss.backward()
    # by hand: live tokens (row 0 both, row 2 first); -A r, clipped: r = e^0.2 <= 1.28 and A < 0: loss e^0.2,
    # e^-0.1 (clip keeps max(r, 0.8) A-side: max(-A r, -A clip(r)) = max(e^-0.1, 0.905) = e^-0.1); row 2: -0.5
    expected = (np.exp(0.2) + np.exp(-0.1) - 0.5) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    reference = values.clone().requires_grad_(True)
    vanilla, _ = compute_policy_loss_vanilla(old, reference, advantages, mask * (advantages != 0), "token-mean",
                                             actor_config())
    vanilla.backward()
    assert loss.item() == vanilla.item()
    assert torch.equal(new.grad, reference.grad)
    assert new.grad[1].abs().sum() == 0  # the A = 0 response: no gradient


def test_the_dual_clip_is_kept():
    """A < 0 with r = e^2 (7.39 > c = 3): the token's loss is -c A = 3, not r (-A) = 7.39."""
    old, new = torch.zeros(1, 1), torch.full((1, 1), 2.0)
    loss, metrics = compute_policy_loss_agpo(old, new, torch.full((1, 1), -1.0), torch.ones(1, 1), "token-mean",
                                             actor_config())
    assert loss.item() == pytest.approx(3.0) and metrics["actor/pg_clipfrac_lower"] == 1.0


def test_the_loss_needs_the_actor_config():
    with pytest.raises(MethodConfigError, match="loss_mode=agpo needs the actor config"):
        compute_policy_loss_agpo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))


# --- the launch ------------------------------------------------------------------------------------------------

def launch(**algorithm):
    config = OmegaConf.create({"algorithm": {"adv_estimator": "agpo", **algorithm}})
    return Launch(config, recipe_trainer=True, verl_mode="sync")


def test_the_launch_refuses_a_kl_penalty_in_the_rewards_and_the_zero_variance_rescale():
    check_rewards(launch())
    with pytest.raises(MethodConfigError, match="^algorithm.use_kl_in_reward=true with algorithm.adv_estimator=agpo"):
        check_rewards(launch(use_kl_in_reward=True))
    with pytest.raises(MethodConfigError, match="^algorithm.zero_variance=exclude with algorithm.adv_estimator=agpo"):
        check_rewards(launch(zero_variance="exclude"))
    check_rewards(Launch(OmegaConf.create({"algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": True}}),
                         recipe_trainer=True, verl_mode="sync"))  # not AGPO: not its business


def test_the_runtime_refuses_the_same_so_the_testbed_does_too():
    from recipe_apo.methods.agpo.runtime import AgpoRuntime

    config = OmegaConf.create({"algorithm": {"adv_estimator": "agpo", "zero_variance": "exact"}})
    with pytest.raises(MethodConfigError, match="^algorithm.zero_variance=exact with algorithm.adv_estimator=agpo"):
        AgpoRuntime(config)
