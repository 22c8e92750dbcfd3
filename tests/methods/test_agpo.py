"""AGPO as its authors built it: the training rewards and advantages on batches worked by hand, on both reward
scales (``algorithm.agpo.wrong_reward``), and against the authors' pipeline re-written as per-response loops
(tests/helpers/agpo_reference.py, verl pull request #2649 at 4cbea10: math_dapo's scores, the reward manager's
length bonus, ``compute_agpo_outcome_advantage``); the loss's value and gradient (its mask, its clips and its clip at
0) by hand and under verl 0.9.1's aggregation over several micro-batches; the settings and the launch checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.agpo_reference import authors_advantages, authors_pipeline, authors_shaped
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from recipe_apo.methods.agpo.estimator import agpo_outcome_advantage, compute_agpo_advantage
from recipe_apo.methods.agpo.launch import check_rewards
from recipe_apo.methods.agpo.loss import compute_policy_loss_agpo
from recipe_apo.methods.agpo.settings import AgpoConfigError, AgpoSettings
from recipe_apo.methods.base import Launch
from recipe_apo.methods.errors import MethodConfigError

AS_HANDED = AgpoSettings(wrong_reward=0)  # the rewards as scored: pins the 0/1 semantics


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

def test_a_batch_worked_by_hand_with_wrong_answers_at_0():
    """wrong_reward=0. Group a: right answers of 2 and 4 tokens, a wrong one: shaped 1.1, 1.0, 0 (mean 0.7, sample
    std sqrt(0.37)). Group b: all right (no bonus: +1). Group c: all wrong (-1). Group d: alone (mean 0, std 1)."""
    rewards, mask, uids = batch([2, 4, 3, 5, 1, 2, 3, 2], [1, 1, 0, 1, 1, 0, 0, 1],
                                ["a", "a", "a", "b", "b", "c", "c", "d"])
    advantages, rows = compute_agpo_advantage(rewards, mask, uids, settings=AS_HANDED)
    std = np.sqrt(0.37)
    expected = [0.4 / (std + 1e-6), 0.3 / (std + 1e-6), -0.7 / (std + 1e-6), 1.0, 1.0, -1.0, -1.0, 1.0 / (1 + 1e-6)]
    assert advantages[:, 0].tolist() == pytest.approx(expected, rel=1e-6)
    # every valid token gets its response's advantage, padding gets 0
    assert torch.equal(advantages, advantages[:, :1] * mask)
    assert rows["shaped"].tolist() == pytest.approx([1.1, 1.0, 0, 1, 1, 0, 0, 1], rel=1e-7)
    assert rows["bonused"].tolist() == [True, True, False, False, False, False, False, False]
    assert rows["saturated"].tolist() == [0, 0, 0, 1, 1, -1, -1, 0]


def test_a_batch_worked_by_hand_on_the_authors_scale():
    """The default, wrong_reward=-1 (math_dapo: right +1, wrong -1), on the same 0/1 rewards except group d's one
    answer, now wrong. Group a: shaped 1.1, 1.0, -1: mean 11/30, deviations 22/30, 19/30, -41/30, sample variance
    (22^2 + 19^2 + 41^2) / 900 / 2 = 1263/900: A = (22, 19, -41) / 30 / (sqrt(1263) / 30 + 1e-6) = 0.619, 0.535,
    -1.154 (at 0/1 they were 0.658, 0.493, -1.151: the bonus's 0.1 is half the weight against a gap of 2). Group b:
    all right, +1. Group c: all wrong, all -1: mean -1, std 0, A = 0 (no -1: the loss's mask drops them).
    Group d: alone, -1 / (1 + 1e-6). The padding row: A = 0."""
    rewards, mask, uids = batch([2, 4, 3, 5, 1, 2, 3, 2, 0], [1, 1, 0, 1, 1, 0, 0, 0, 0],
                                ["a", "a", "a", "b", "b", "c", "c", "d", "d"])
    advantages, rows = compute_agpo_advantage(rewards, mask, uids)
    std = np.sqrt(1263) / 30
    expected = [22 / 30 / (std + 1e-6), 19 / 30 / (std + 1e-6), -41 / 30 / (std + 1e-6), 1.0, 1.0, 0.0, 0.0,
                -1.0 / (1 + 1e-6), 0.0]
    assert advantages[:, 0].tolist() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert expected[:3] == pytest.approx([0.61904, 0.53463, -1.15367], abs=1e-5)
    assert torch.equal(advantages, advantages[:, :1] * mask)
    assert rows["shaped"].tolist() == pytest.approx([1.1, 1.0, -1, 1, 1, -1, -1, -1, 0], rel=1e-7)
    assert rows["bonused"].tolist() == [True, True] + [False] * 7
    assert rows["saturated"].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0]  # the all-wrong group's -1 never fires


def test_the_bonus_runs_from_the_shortest_to_the_longest_correct_response():
    """Lengths 2, 3, 6 right and one wrong: 1 + 0.1 (1 - (L - 2) / 4) = 1.1, 1.075, 1.0; the wrong one -1 (0 with
    wrong_reward=0)."""
    rewards, mask, uids = batch([2, 3, 6, 1], [1, 1, 1, 0], ["g"] * 4)
    _, rows = compute_agpo_advantage(rewards, mask, uids)
    assert rows["shaped"].tolist() == [np.float32(1.1), np.float32(1.075), 1.0, -1.0]
    _, rows = compute_agpo_advantage(rewards, mask, uids, settings=AS_HANDED)
    assert rows["shaped"].tolist() == [np.float32(1.1), np.float32(1.075), 1.0, 0.0]


def test_every_reward_other_than_1_is_wrong_on_the_authors_scale():
    """math_dapo gives +1 or -1 only: a partial reward (0.5, 0.99) or a negative one trains on -1, 1 stays 1."""
    rewards, mask, uids = batch([2, 3, 4, 5, 6], [1, 0.5, 0.99, -0.3, 2.0], ["g"] * 5)
    _, rows = compute_agpo_advantage(rewards, mask, uids, settings=AgpoSettings(length_bonus=0.0))
    assert rows["shaped"].tolist() == [1.0, -1.0, -1.0, -1.0, -1.0]


@pytest.mark.parametrize("lengths, rewards, why", [
    ([2, 4, 3], [1, 1, 1], "all right"),
    ([3, 3, 2], [1, 1, 0], "the right answers have one length"),
    ([3, 2, 5], [1, 0.5, 0], "one right answer"),
    ([3, 2, 5], [0.9, 0.95, 0], "no reward is exactly 1"),
])
@pytest.mark.parametrize("wrong_reward", [-1, 0])
def test_no_bonus(lengths, rewards, why, wrong_reward):
    reward_tensor, mask, uids = batch(lengths, rewards, ["g"] * 3)
    _, rows = compute_agpo_advantage(reward_tensor, mask, uids,
                                     settings=AgpoSettings(length_bonus=0.3, wrong_reward=wrong_reward))
    assert not rows["bonused"].any(), why
    scored = rewards if wrong_reward == 0 else [1 if r == 1 else -1 for r in rewards]
    assert rows["shaped"].tolist() == pytest.approx(scored)


def test_the_settings_turn_each_piece_off():
    rewards, mask, uids = batch([2, 4, 3, 5, 1], [1, 1, 0, 1, 1], ["a", "a", "a", "b", "b"])
    plain, _ = compute_agpo_advantage(rewards, mask, uids, settings=AgpoSettings(length_bonus=0.0,
                                                                                saturated_signal=False,
                                                                                wrong_reward=0))
    # GRPO: verl's own estimator
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, uids)
    torch.testing.assert_close(plain, grpo, rtol=1e-6, atol=1e-6)
    no_bonus, rows = compute_agpo_advantage(rewards, mask, uids, settings=AgpoSettings(length_bonus=0.0))
    assert not rows["bonused"].any() and no_bonus[3:, 0].tolist() == [1.0, 1.0]
    centred, _ = compute_agpo_advantage(rewards, mask, uids, norm_adv_by_std=False, settings=AS_HANDED)
    assert centred[:3, 0].tolist() == pytest.approx([1.1 - 0.7, 1.0 - 0.7, -0.7], rel=1e-6)
    # -1/+1: 1.1, 1.0, -1 around 11/30; without std normalization the doubled gap doubles the advantages
    centred, _ = compute_agpo_advantage(rewards, mask, uids, norm_adv_by_std=False)
    assert centred[:3, 0].tolist() == pytest.approx([22 / 30, 19 / 30, -41 / 30], rel=1e-6)


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
    # -1/+1 by default: 1, 1, -1 around 1/3
    assert advantages[:, 0].tolist() == pytest.approx([2 / 3, 2 / 3, -4 / 3], rel=1e-6) and returns is advantages
    config.agpo.wrong_reward = 0
    advantages, _ = agpo_outcome_advantage(rewards, mask, config=config, index=uids)
    assert advantages[:, 0].tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3], rel=1e-6)
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
    ("wrong_reward", 1, "^algorithm.agpo.wrong_reward must be -1 .* or 0 .*, got 1$"),
    ("wrong_reward", -0.5, "algorithm.agpo.wrong_reward"),
    ("wrong_reward", False, "algorithm.agpo.wrong_reward"),
    ("wrong_reward", "-1", "algorithm.agpo.wrong_reward"),
    ("wrong_reward", None, "algorithm.agpo.wrong_reward"),
])
def test_bad_settings_are_one_line_naming_the_key(key, value, said):
    with pytest.raises(AgpoConfigError, match=said) as refused:
        AgpoSettings.from_algorithm_config({"agpo": {key: value}})
    assert "\n" not in str(refused.value)


def test_the_default_scale_is_the_authors_and_both_scales_are_read():
    assert AgpoSettings().wrong_reward == -1
    assert AgpoSettings.from_algorithm_config(OmegaConf.create({"agpo": {"wrong_reward": 0}})).wrong_reward == 0


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
    # the authors' estimator on the rewards as handed (their reward manager on any scorer's rewards)
    advantages, rows = compute_agpo_advantage(reward_tensor, mask, index, norm_adv_by_std=norm, settings=AS_HANDED)
    shaped = authors_shaped(rewards, lengths, uids)
    assert rows["shaped"].astype(np.float32).tolist() == shaped.tolist()  # the same floats
    expected = authors_advantages(shaped, uids, norm)
    # float64 statistics here, float32 in the source
    torch.testing.assert_close(advantages[:, 0], expected, rtol=2e-6, atol=2e-6)


@st.composite
def verdicts(draw):
    """0/1 rewards of groups that are mixed, all right or all wrong (some groups of one), lengths 1-8, the uids."""
    n_groups = draw(st.integers(1, 6))
    lengths, rewards, uids = [], [], []
    for g in range(n_groups):
        size = draw(st.integers(1, 6))
        kind = draw(st.sampled_from(["mixed", "mixed", "all right", "all wrong"]))
        if kind == "mixed":
            group = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=size, max_size=size))
        else:
            group = [1.0 if kind == "all right" else 0.0] * size
        rewards += group
        lengths += draw(st.lists(st.integers(1, 8), min_size=size, max_size=size))
        uids += [f"u{g}"] * size
    return lengths, rewards, uids, draw(st.booleans())


@settings(max_examples=200, deadline=None)
@given(verdicts())
def test_the_registered_estimator_on_0_1_rewards_is_the_authors_pipeline(case):
    """wrong_reward=-1 (the default): math_dapo's +-1 scores, their reward manager's bonus, their estimator."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import recipe_apo.plugin  # noqa: F401  (registers agpo with verl)

    lengths, rewards, uids, norm = case
    reward_tensor, mask, index = batch(lengths, rewards, uids, width=8)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": norm, "agpo": {"wrong_reward": -1}})
    advantages, _ = get_adv_estimator_fn("agpo")(token_level_rewards=reward_tensor, response_mask=mask,
                                                 config=config, index=index)
    shaped, expected = authors_pipeline(rewards, lengths, uids, norm)
    # their estimator returns each response's score times its response mask
    torch.testing.assert_close(advantages, expected.unsqueeze(-1) * mask, rtol=2e-6, atol=2e-6)
    _, rows = compute_agpo_advantage(reward_tensor, mask, index, norm_adv_by_std=norm)
    assert rows["shaped"].astype(np.float32).tolist() == shaped.tolist()  # the same floats


@settings(max_examples=100, deadline=None)
@given(verdicts())
def test_on_0_1_rewards_the_authors_scale_is_half_the_bonus_at_0(case):
    """R~ at -1/+1 is 2 R~' - 1 with R~' at wrong_reward=0 and b / 2, so std-normalized advantages agree, except in
    all-wrong groups (0 against -1) and groups of one (a wrong answer -1 against 0)."""
    lengths, rewards, uids, _ = case
    reward_tensor, mask, index = batch(lengths, rewards, uids, width=8)
    authors, _ = compute_agpo_advantage(reward_tensor, mask, index, settings=AgpoSettings(length_bonus=0.1))
    half, _ = compute_agpo_advantage(reward_tensor, mask, index,
                                     settings=AgpoSettings(length_bonus=0.05, wrong_reward=0))
    members = {uid: [r for r, u in zip(rewards, uids) if u == uid] for uid in uids}
    alike = torch.tensor([len(members[u]) > 1 and max(members[u]) == 1 for u in uids])
    torch.testing.assert_close(authors[alike, 0], half[alike, 0], rtol=1e-5, atol=1e-5)
    all_wrong = torch.tensor([len(members[u]) > 1 and max(members[u]) == 0 for u in uids])
    assert (authors[all_wrong, 0] == 0).all() and (half[all_wrong, 0] == -1).all()
    alone = ~alike & ~all_wrong
    wanted = torch.tensor(rewards)[alone]
    torch.testing.assert_close(authors[alone, 0], (2 * wanted - 1) / (1 + 1e-6))
    torch.testing.assert_close(half[alone, 0], wanted / (1 + 1e-6))


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


def test_a_positive_loss_and_its_gradient_by_hand_on_the_live_mask():
    """Old log-probs 0, so r = e^(new), clip 0.2 / 0.28, dual clip 3. Row 0, A = -1: r = e^0.2 (inside the band:
    loss e^0.2, d/dlog r = e^0.2) and r = e^1.2 = 3.32 (beyond c = 3: loss 3, no gradient). Row 1, A = 0: not a
    live token. Row 2, A = 0.5, one valid token, r = e^0.3 = 1.35 (above 1.28: loss -0.5 x 1.28 = -0.64, no
    gradient). Row 3, A = 0.5: r = e^-0.1 (loss -0.5 e^-0.1, gradient the same) and r = 1 (loss -0.5, gradient
    -0.5). Token-mean over the 5 live tokens: (e^0.2 + 3 - 0.64 - 0.5 e^-0.1 - 0.5) / 5 = 0.5258 > 0: kept."""
    old = torch.zeros(4, 2)
    new = torch.tensor([[0.2, 1.2], [0.3, 0.3], [0.3, 0.0], [-0.1, 0.0]], requires_grad=True)
    advantages = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [0.5, 0.5], [0.5, 0.5]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    loss, metrics = compute_policy_loss_agpo(old, new, advantages, mask, "token-mean", actor_config())
    expected = (np.exp(0.2) + 3.0 - 0.64 - 0.5 * np.exp(-0.1) - 0.5) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-6) and expected == pytest.approx(0.52580, abs=1e-5)
    loss.backward()
    gradient = torch.tensor([[np.exp(0.2), 0.0], [0.0, 0.0], [0.0, 0.0], [-0.5 * np.exp(-0.1), -0.5]]) / 5
    torch.testing.assert_close(new.grad, gradient.float(), rtol=1e-6, atol=1e-7)
    # verl's clip metrics over the live tokens: row 2's upper clip, row 0's dual clip, of 5 (not of 7)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 5) and metrics["actor/pg_clipfrac_lower"] == \
        pytest.approx(1 / 5) and metrics["actor/agpo_loss_clipped"] == 0.0


def ppo_token_losses(old, new, advantages, low=0.2, high=0.28, c=3.0):
    """The clipped surrogate per token, from the PPO and dual-clip papers' formulas: max(-A r, -A clip(r)), and for
    A < 0 at most -c A."""
    ratio = torch.exp(new - old)
    surrogate = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - low, 1 + high))
    return torch.where(advantages < 0, torch.minimum(surrogate, -c * advantages), surrogate)


def mini_batch(seed, rows=12, width=7):
    """A mini-batch of AGPO-like rows: response lengths 1-7, per-response advantages with A = 0 rows (an all-wrong
    group at -1/+1), ratios e^U(-0.6, 0.6), and one token beyond the dual clip."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width) < lengths[:, None]).float()
    advantages = (torch.randn(rows, 1, generator=g) * (torch.arange(rows)[:, None] % 5 != 2)).expand(rows, width)
    advantages = advantages.clone() * mask
    old = -torch.rand(rows, width, generator=g) * 2
    new = old + (torch.rand(rows, width, generator=g) - 0.5) * 1.2
    new[advantages[:, 0].argmin(), 0] = old[advantages[:, 0].argmin(), 0] + 1.5  # r = 4.5 > c, A < 0
    return old, new, advantages, mask


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("micro", [1, 3, 4])
def test_the_loss_under_verls_aggregation_over_several_micro_batches(seed, micro):
    """verl 0.9.1's actor: ``ppo_loss`` hands every micro-batch's loss the mini-batch's count of response tokens N
    (``global_batch_info``; the engine's ``forward_backward_batch`` counts the ``loss_mask``, the response mask) and
    accumulates the micro-batch gradients. So the mini-batch trains on sum_m max(0, sum_(t in m, A_t != 0) l_t / N):
    value and gradient against that formula."""
    old, new, advantages, mask = mini_batch(seed)
    parts = np.array_split(np.arange(mask.shape[0]), micro)
    config = actor_config()
    log_prob = new.clone().requires_grad_(True)
    total = 0.0
    for rows in parts:
        config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=len(mask),
                                        loss_scale_factor=None)
        loss, _ = compute_policy_loss_agpo(old[rows], log_prob[rows], advantages[rows], mask[rows], "token-mean",
                                           config)
        total = total + loss
    total.backward()

    reference = new.clone().requires_grad_(True)
    live = mask * (advantages != 0)
    per_token = ppo_token_losses(old, reference, advantages) * live
    expected = sum(torch.clamp(per_token[rows].sum() / mask.sum(), min=0.0) for rows in parts)
    expected.backward()
    assert total.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(log_prob.grad, reference.grad, rtol=1e-5, atol=1e-7)
    assert (live.sum() < mask.sum()).item()  # the A = 0 rows count in N, not in the sums


def test_the_authors_per_micro_batch_mean_agrees_with_verls_only_on_one_micro_batch():
    """The authors' verl: each micro-batch's mean over its own live tokens, clipped at 0, divided by the number of
    micro-batches. With one micro-batch and no A = 0 row it is verl 0.9.1's loss; with several micro-batches the
    weights 1 / (M n_m) and 1 / N differ (scripts/agpo_aggregation.py measures how much)."""
    old, new, advantages, mask = mini_batch(0)
    advantages = torch.where(advantages == 0, 0.7, advantages) * mask  # no A = 0 row

    def gradient(parts, global_tokens):
        config = actor_config()
        log_prob = new.clone().requires_grad_(True)
        losses = []
        for rows in parts:
            if global_tokens:
                config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()),
                                                global_batch_size=len(mask), loss_scale_factor=None)
            loss, _ = compute_policy_loss_agpo(old[rows], log_prob[rows], advantages[rows], mask[rows],
                                               "token-mean", config)
            losses.append(loss if global_tokens else loss / len(parts))
        torch.stack(losses).sum().backward()
        return log_prob.grad.flatten()

    whole = [np.arange(mask.shape[0])]
    torch.testing.assert_close(gradient(whole, True), gradient(whole, False), rtol=1e-6, atol=1e-8)
    # hand-made micro-batches of 2, 4 and 6 responses: their live-token counts differ
    parts = [np.arange(0, 2), np.arange(2, 6), np.arange(6, 12)]
    ours, theirs = gradient(parts, True), gradient(parts, False)
    assert ours.norm() > 0 and theirs.norm() > 0
    assert torch.dot(ours, theirs) / (ours.norm() * theirs.norm()) < 0.999


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
