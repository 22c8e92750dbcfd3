"""R2PO's maths: the rarity and range-skip advantages against the source's per-group definitions
(tests/helpers/r2po_reference.py) and hand-computed values, the schedule, the settings' refusals, the runtime's
choice of logits head per pass, and the rollout-head model (its logits, where its gradients go, its files, how far
pi_roll is from pi_base)."""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
import torch
from helpers.r2po_reference import policy_advantage, reward_rarity
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe_apo.methods import driver_state, handoff
from recipe_apo.methods.base import ActorCall
from recipe_apo.methods.errors import MethodStateError
from recipe_apo.methods.r2po import METHOD
from recipe_apo.methods.r2po.estimator import compute_advantage, r2po_outcome_advantage, rarity_outcome_advantage
from recipe_apo.methods.r2po.model import HEAD_KL, HEAD_LOGIT_GAP, head_gap_rows, response_mean
from recipe_apo.methods.r2po.schedule import HEAD, POLICY, Phase, phase_at
from recipe_apo.methods.r2po.settings import R2poConfigError, R2poSettings

# The reward values of the source's reward (accuracy +-1 plus format 1.25 or -1) and of 0/1 rewards.
REWARDS = (2.25, 0.25, 0.0, -2.0, 1.0)


def batch(groups: list[list[float]], order: np.ndarray | None = None):
    scores = [r for g in groups for r in g]
    uids = [f"g{i}" for i, g in enumerate(groups) for _ in g]
    n = len(scores)
    order = np.arange(n) if order is None else order
    rewards = torch.zeros(n, 3)
    rewards[:, 1] = torch.tensor(scores, dtype=torch.float32)[order]
    mask = torch.ones(n, 3)
    return rewards, mask, np.array(uids, dtype=object)[order], order


# ---- the rarity advantage (head phase) --------------------------------------------------------------------------
def test_rarity_by_hand():
    # s = 1, 1/3, 1/3, 1/3: mean 1/2, sample std 1/3; A = (s - 1/2) / (1/3 + 1e-6)
    rewards, mask, uids, _ = batch([[1.0, 0.0, 0.0, 0.0]])
    advantages, _ = rarity_outcome_advantage(rewards, mask, index=uids)
    expected = torch.tensor([0.5, -1 / 6, -1 / 6, -1 / 6]) / (1 / 3 + 1e-6)
    torch.testing.assert_close(advantages[:, 0], expected)
    torch.testing.assert_close(advantages[:, 1], expected)  # every token its response's A
    assert expected[0].item() == pytest.approx(1.4999955, abs=1e-6)


@pytest.mark.parametrize("group", [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [2.25, 0.25, 0.0, -2.0], [0.5]])
def test_rarity_skips_a_group_whose_rarities_are_all_equal(group):
    rewards, mask, uids, _ = batch([group, [1.0, 0.0, 0.0]])
    advantages, rows = compute_advantage(rewards, mask, uids, HEAD)
    assert advantages[: len(group)].abs().sum() == 0
    assert rows["skipped"].tolist() == [True] * len(group) + [False] * 3
    torch.testing.assert_close(advantages[len(group):, 0], reward_rarity(torch.tensor([1.0, 0.0, 0.0])))


def test_equal_rarities_whose_float32_mean_is_off_by_a_bit_train_as_the_source_trains_them():
    # 9 responses in three thirds: s = 1/3 each, and float32's mean of nine 1/3 is not 1/3: the source's
    # (s - mean) / (std + 1e-6) is then a small constant, not 0, and the group is not skipped.
    group = [2.25, 2.25, 2.25, 0.25, 0.25, 0.25, 0.0, 0.0, 0.0]
    rewards, mask, uids, _ = batch([group, [1.0, 1.0, 0.0, 0.0]])
    advantages, rows = compute_advantage(rewards, mask, uids, HEAD)
    expected = reward_rarity(torch.tensor(group))
    assert expected.abs().min() > 0.02 and len(set(expected.tolist())) == 1
    torch.testing.assert_close(advantages[:9, 0], expected)
    assert rows["skipped"].tolist() == [False] * 9 + [True] * 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(REWARDS), min_size=1, max_size=9), min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_rarity_is_the_sources_reward_rarity_group_by_group(groups, rng):
    n = sum(len(g) for g in groups)
    order = np.array(rng.sample(range(n), n))  # groups interleaved: the estimator groups by uid, not by position
    rewards, mask, uids, order = batch(groups, order)
    advantages, _ = rarity_outcome_advantage(rewards, mask, index=uids)
    start = 0
    expected = torch.empty(n)
    for group in groups:
        expected[start:start + len(group)] = reward_rarity(torch.tensor(group, dtype=torch.float32))
        start += len(group)
    torch.testing.assert_close(advantages[:, 0], expected[torch.from_numpy(order)], rtol=1e-5, atol=1e-5)


def test_on_0_1_rewards_rarity_pushes_a_mostly_right_group_toward_its_wrong_answers():
    # 6 of 8 right: s = 1/6 (right), 1/2 (wrong); mean 1/4; deviations -1/12 and +1/4, squares summing to 1/6,
    # sample std sqrt(1/6 / 7) = 1/sqrt(42): A = -sqrt(42)/12 = -0.540 on the right, +sqrt(42)/4 = +1.620 on the wrong.
    rewards, mask, uids, _ = batch([[1.0] * 6 + [0.0] * 2, [2.25] * 6 + [0.25] * 2, [1.0] * 2 + [0.0] * 6])
    advantages, _ = compute_advantage(rewards, mask, uids, HEAD)
    std = 1 / math.sqrt(42) + 1e-6
    mostly_right = torch.tensor([-1 / 12] * 6 + [1 / 4] * 2) / std
    torch.testing.assert_close(advantages[:8, 0], mostly_right)
    assert mostly_right[0].item() == pytest.approx(-0.5401, abs=1e-4)
    assert mostly_right[7].item() == pytest.approx(1.6202, abs=1e-4)
    # the source's reward does the same where a group's answers all match the format (2.25 right, 0.25 wrong) ...
    torch.testing.assert_close(advantages[8:16, 0], mostly_right)
    # ... and a mostly wrong group is pushed toward its right answers
    torch.testing.assert_close(advantages[16:, 0], mostly_right.flip(0))


def test_padding_rows_take_no_part():
    rewards, mask, uids, _ = batch([[1.0, 0.0, 0.0, 0.0, 1.0]])
    mask[4] = 0  # the fifth row has no valid token: the group is the first four
    advantages, rows = compute_advantage(rewards, mask, uids, HEAD)
    torch.testing.assert_close(advantages[:4, 0], reward_rarity(torch.tensor([1.0, 0.0, 0.0, 0.0])))
    assert advantages[4].abs().sum() == 0 and rows["valid"].tolist() == [True] * 4 + [False]


# ---- GRPO with the range skip (policy phase) --------------------------------------------------------------------
def test_policy_phase_by_hand_and_its_range_skip():
    rewards, mask, uids, _ = batch([[1.0, 0.0, 0.0, 0.0], [0.3, 0.305, 0.3], [2.25, -2.0]])
    advantages, rows = compute_advantage(rewards, mask, uids, POLICY)
    # mean 1/4, sample std 1/2: (1 - 1/4) / (1/2 + 1e-4), (0 - 1/4) / (1/2 + 1e-4)
    torch.testing.assert_close(advantages[:4, 0], torch.tensor([0.75, -0.25, -0.25, -0.25]) / 0.5001)
    assert advantages[4:7].abs().sum() == 0  # spans 0.005 < 0.01: skipped
    torch.testing.assert_close(advantages[7:, 0], policy_advantage(torch.tensor([2.25, -2.0])))
    assert rows["skipped"].tolist() == [False] * 4 + [True] * 3 + [False] * 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(REWARDS), min_size=1, max_size=8), min_size=1, max_size=5))
def test_policy_phase_is_the_sources_group_by_group(groups):
    rewards, mask, uids, _ = batch(groups)
    advantages, _ = compute_advantage(rewards, mask, uids, POLICY)
    expected = torch.cat([policy_advantage(torch.tensor(g)) for g in groups])
    torch.testing.assert_close(advantages[:, 0], expected, rtol=1e-5, atol=1e-5)


def test_a_spread_of_0_01_is_no_skip_in_the_rewards_own_precision():
    # float32 holds 0.01 as 0.00999999978, and 0.31 - 0.3 as 0.00999999046: neither can be told from 0.01 there
    for low, high in ((0.0, 0.01), (0.3, 0.31), (-0.31, -0.3), (7.0, 7.01)):
        rewards, mask, uids, _ = batch([[low, high]])
        advantages, rows = compute_advantage(rewards, mask, uids, POLICY)
        r = rewards[:, 1].double()  # mean (a + b) / 2, sample std |b - a| / sqrt(2)
        expected = (r - r.mean()) / ((r[1] - r[0]).abs() / math.sqrt(2) + 1e-4)
        assert not rows["skipped"].any(), (low, high)
        torch.testing.assert_close(advantages[:, 0], expected.float())
    rewards, mask, uids, _ = batch([[0.0, 0.0099], [0.3, 0.3099], [5.0, 5.0]])
    assert compute_advantage(rewards, mask, uids, POLICY)[1]["skipped"].all()


@settings(max_examples=80, deadline=None)
@given(st.integers(-10_000, 10_000), st.sampled_from([torch.float32, torch.float64, torch.float16]))
def test_rewards_0_01_apart_are_kept_and_0_0099_apart_skipped(k, dtype):
    def skipped(gap):
        rewards = torch.zeros(2, 2, dtype=dtype)
        rewards[:, 0] = torch.tensor([k / 100, k / 100 + gap], dtype=torch.float64).to(dtype)
        distinct = bool(rewards[0, 0] != rewards[1, 0])
        return bool(compute_advantage(rewards, torch.ones(2, 2), np.array(["g", "g"]), POLICY)[1]["skipped"][0]), \
            distinct

    kept, distinct = skipped(0.01)
    assert kept == (not distinct)  # only rewards the dtype cannot hold apart are skipped
    narrow, _ = skipped(0.0099)
    assert narrow or dtype == torch.float16  # float16 cannot tell 0.0099 from 0.01 past 1 (its unit: 0.001)


def test_any_kl_penalty_in_the_reward_empties_the_rarity_advantage():
    # why the launch refuses algorithm.use_kl_in_reward: a penalty different for every response makes every reward
    # of a group distinct (s = 1 for all), and rarity then skips the group, whatever the answers
    group = torch.tensor([0.0, 0.0, 0.0, 1.0]) - 6e-8 * torch.arange(1, 5)
    rewards, mask, uids, _ = batch([group.tolist(), [0.0, 0.0, 0.0, 1.0]])
    advantages, rows = compute_advantage(rewards, mask, uids, HEAD)
    assert advantages[:4].abs().sum() == 0 and rows["skipped"][:4].all()
    assert advantages[4:].abs().sum() > 0  # without it, the same answers carry a signal


@pytest.mark.parametrize("phase", [2, -1, "head", None, 0.0, True, "1"])
def test_a_phase_that_is_no_phase_is_refused_in_one_line(phase):
    rewards, mask, uids, _ = batch([[1.0, 0.0]])
    with pytest.raises(MethodStateError) as info:
        compute_advantage(rewards, mask, uids, phase)
    assert str(info.value) == f"r2po: the step's phase must be 0 (head) or 1 (policy), got {phase!r}"
    if phase is None:  # what the runtime hands as no phase at all: its own refusal (above)
        return
    driver_state.keep("r2po", phase)
    try:
        with pytest.raises(MethodStateError, match=r"^r2po: the step's phase must be 0 \(head\) or 1 \(policy\)"):
            r2po_outcome_advantage(rewards, mask, index=uids)
    finally:
        driver_state.forget("r2po")
    assert compute_advantage(rewards, mask, uids, np.int64(1))[1]["skipped"].tolist() == [False, False]


def test_the_r2po_estimator_takes_the_phase_the_runtime_handed():
    rewards, mask, uids, _ = batch([[1.0, 0.0, 0.0, 0.0]])
    driver_state.forget("r2po")
    with pytest.raises(MethodStateError, match="reads the step's phase from R2PO's runtime"):
        r2po_outcome_advantage(rewards, mask, index=uids)
    for phase in (HEAD, POLICY):
        driver_state.keep("r2po", phase)
        advantages, _ = r2po_outcome_advantage(rewards, mask, index=uids)
        torch.testing.assert_close(advantages, compute_advantage(rewards, mask, uids, phase)[0])
    driver_state.forget("r2po")


def test_the_registered_names_are_the_estimators():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    import recipe_apo.plugin  # noqa: F401  (registers)

    assert get_adv_estimator_fn("rarity") is rarity_outcome_advantage
    assert get_adv_estimator_fn("r2po") is r2po_outcome_advantage


# ---- the schedule and the settings ------------------------------------------------------------------------------
def test_the_released_schedule():
    released = R2poSettings()
    phases = [phase_at(step, released) for step in range(1, 221)]
    spans, start = [], 0
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i].phase != phases[start].phase:
            spans.append((phases[start].phase, i - start))
            start = i
    # 20 head steps every round; 40, 40, 20, 20, ... policy steps
    assert spans == [(0, 20), (1, 40), (0, 20), (1, 40), (0, 20), (1, 20), (0, 20), (1, 20), (0, 20)]
    assert phase_at(61, released).round == 1 and phase_at(60, released).round == 0
    assert phase_at(61, released).first and not phase_at(62, released).first


def test_phases_of_one_step():
    one = R2poSettings(head_steps=1, policy_steps=1)
    assert [(p.phase, p.round, p.first) for p in (phase_at(s, one) for s in (1, 2, 3, 4))] == [
        (0, 0, True), (1, 0, True), (0, 1, True), (1, 1, True)]
    assert R2poSettings(policy_steps=[3, 1]).policy_steps == (3, 1)


def walked_phases(settings: R2poSettings, last: int) -> list[tuple[int, int, int]]:
    """(phase, round, index) of steps 1..last, laid out round by round as the settings read: the oracle of the
    closed form."""
    phases, round_ = [], 0
    while len(phases) < last:
        phases += [(HEAD, round_, i) for i in range(1, settings.head_steps + 1)]
        policy = settings.policy_steps[min(round_, len(settings.policy_steps) - 1)]
        phases += [(POLICY, round_, i) for i in range(1, policy + 1)]
        round_ += 1
    return phases[:last]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(1, 12), min_size=1, max_size=6), st.integers(1, 400),
       st.integers(0, 10**18))
def test_the_phase_of_a_step_is_the_walk_over_the_schedule(head, policy, last, shift):
    schedule = R2poSettings(head_steps=head, policy_steps=policy)
    walked = walked_phases(schedule, last)
    assert [(p.phase, p.round, p.index) for p in (phase_at(s, schedule) for s in range(1, last + 1))] == walked
    # past the listed rounds the schedule repeats its last round: shift a step by whole rounds, far into the run
    prefix = sum(head + steps for steps in policy[:-1])
    period, step = head + policy[-1], prefix + last
    rounds = shift // period
    far = phase_at(step + rounds * period, schedule)
    near = phase_at(step, schedule)
    assert (far.phase, far.round, far.index) == (near.phase, near.round + rounds, near.index)


def test_the_phase_far_into_a_run_by_hand_in_microseconds():
    import timeit

    released = R2poSettings()  # 20 head steps; rounds 0, 1 span 60 steps each, then every round 40 (20 + 20)
    # step 10**18 = 120 + 40 (r - 2) + 40 ends round r = (10**18 - 160) / 40 + 2 = 25 * 10**15 - 2
    assert phase_at(10**18, released) == Phase(10**18, POLICY, 25 * 10**15 - 2, 20)
    # step 10**9 = 120 + 40 * (25 * 10**6 - 3) - 40 + 40: the same place, round 25 * 10**6 - 2
    assert phase_at(10**9, released) == Phase(10**9, POLICY, 25 * 10**6 - 2, 20)
    assert phase_at(10**9 + 1, released) == Phase(10**9 + 1, HEAD, 25 * 10**6 - 1, 1)
    assert phase_at(np.int64(121), released) == Phase(121, HEAD, 2, 1)
    for step in (10**9, 10**18):
        seconds = min(timeit.repeat(lambda: phase_at(step, released), number=1000, repeat=5)) / 1000
        assert seconds < 50e-6, seconds  # was 1.6 s at 10**6 (a walk of the rounds); about 2 us here, unloaded


@pytest.mark.parametrize("step", [0, -3, 1.5, 2.0, True, "3", None])
def test_a_step_that_is_no_training_step_is_refused(step):
    with pytest.raises(ValueError) as info:
        phase_at(step, R2poSettings())
    assert str(info.value) == f"training steps are integers counted from 1, got {step!r}"


@pytest.mark.parametrize("node, message", [
    ({"head_steps": 0}, "algorithm.r2po.head_steps must be an integer in [1, 1000000], got 0"),
    ({"head_steps": "20"}, "algorithm.r2po.head_steps must be an integer in [1, 1000000], got '20'"),
    ({"head_steps": True}, "algorithm.r2po.head_steps must be an integer in [1, 1000000], got True"),
    ({"policy_steps": []}, "algorithm.r2po.policy_steps must be an integer or a non-empty list of integers, got []"),
    ({"policy_steps": [40, 0]}, "algorithm.r2po.policy_steps[1] must be an integer in [1, 1000000], got 0"),
    ({"policy_steps": 2.5}, "algorithm.r2po.policy_steps must be an integer in [1, 1000000], got 2.5"),
    ({"head_step": 3}, "unknown setting algorithm.r2po.head_step; known settings: head_steps, policy_steps"),
])
def test_bad_settings_are_refused_by_name(node, message):
    with pytest.raises(R2poConfigError) as info:
        R2poSettings.from_algorithm_config({"r2po": node})
    assert str(info.value) == message


# ---- the runtime ----------------------------------------------------------------------------------------------
def test_the_runtime_picks_each_pass_head_and_restarts_at_each_phase():
    from omegaconf import OmegaConf

    config = OmegaConf.create({"algorithm": {"adv_estimator": "r2po", "r2po": {"head_steps": 2, "policy_steps": 1}}})
    runtime = METHOD.build_runtime(config)
    calls = {step: {call: runtime.actor_call(step, call) for call in ("old_log_probs", "ref_log_probs", "update")}
             for step in (1, 2, 3, 4)}
    assert calls[1] == {"old_log_probs": ActorCall("roll"), "ref_log_probs": ActorCall("base"),
                        "update": ActorCall("roll", True)}
    assert calls[2]["update"] == ActorCall("roll", False)  # the head phase's second step: Adam goes on
    assert calls[3] == {"old_log_probs": ActorCall("base"), "ref_log_probs": ActorCall("base"),
                        "update": ActorCall("base", True)}
    assert calls[4]["update"] == ActorCall("roll", True)
    assert runtime.end_step(3) == {"r2po/phase": 1.0, "r2po/round": 0.0}
    assert runtime.estimator_state() is None  # no step under way: the estimator refuses to guess a phase
    runtime.begin_step(4)
    assert runtime.estimator_state() == HEAD
    handoff.keep_estimator_states([runtime])  # what the adapters do after begin_step
    assert driver_state.kept("r2po", lambda: None) == HEAD
    driver_state.forget("r2po")


# ---- the model ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def head_model(tiny_task, tmp_path_factory):
    from recipe_apo.methods.r2po.model import add_rollout_head

    return add_rollout_head(tiny_task["model"], tmp_path_factory.mktemp("r2po") / "model", seed=1, std=0.05)


def _load(path):
    from transformers import AutoModelForCausalLM

    from recipe_apo.methods.r2po.model import register_hf_models

    register_hf_models()
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)


def test_the_heads_logits_and_where_their_gradients_go(head_model, tiny_task):
    model, plain = _load(head_model), _load(tiny_task["model"])
    assert type(model).__name__ == "R2POQwen2ForCausalLM" and type(plain).__name__ == "Qwen2ForCausalLM"
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])
    roll = model(tokens).logits
    with model.select_logits_head("base"):
        base = model(tokens).logits
    torch.testing.assert_close(base, plain(tokens).logits)  # pi_base is the plain model
    hidden = model.model(tokens).last_hidden_state
    head = model.rollout_head
    torch.testing.assert_close(roll, base + head.layer2(torch.relu(head.layer1(hidden))))  # z + W2 ReLU(W1 h)
    assert (roll - base).abs().max() > 0.1
    roll.logsumexp(-1).sum().backward()  # a loss on pi_roll trains the head alone
    assert {n for n, p in model.named_parameters() if p.grad is not None} == {"rollout_head.layer1.weight",
                                                                            "rollout_head.layer2.weight"}
    model.zero_grad(set_to_none=True)
    with model.select_logits_head("base"):
        model(tokens).logits.logsumexp(-1).sum().backward()
    assert not any(p.grad is not None for n, p in model.named_parameters() if n.startswith("rollout_head."))
    with pytest.raises(ValueError, match="logits head 'both': the model has 'roll' and 'base'"):
        with model.select_logits_head("both"):
            pass


def test_add_draws_the_head_as_the_released_script_starts_it_and_strip_gives_the_plain_model(tiny_task, tmp_path):
    from recipe_apo.methods.r2po.model import RolloutHeadError, add_rollout_head, strip_rollout_head

    path = add_rollout_head(tiny_task["model"], tmp_path / "head", seed=7)
    model = _load(path)
    assert json.loads((path / "config.json").read_text())["architectures"] == ["R2POQwen2ForCausalLM"]
    generator = torch.Generator().manual_seed(7)
    # N(0, 0.02^2), as drawn, as loaded: transformers' draw of a missing Linear weight, the released script's start
    for layer in (model.rollout_head.layer1, model.rollout_head.layer2):
        torch.testing.assert_close(layer.weight, torch.empty_like(layer.weight).normal_(0, 0.02, generator=generator))
    kept = strip_rollout_head(path, tmp_path / "kept")
    assert json.loads((kept / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert (kept / "tokenizer.json").is_file()
    tokens = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(_load(kept)(tokens).logits, _load(tiny_task["model"])(tokens).logits)
    with pytest.raises(RolloutHeadError, match="has a rollout head already"):
        add_rollout_head(path, tmp_path / "twice")
    with pytest.raises(RolloutHeadError, match="has no rollout head"):
        strip_rollout_head(kept, tmp_path / "again")
    # verl's model merger writes the head's weights under the family's own architecture: strip takes that too.
    merged = tmp_path / "merged"
    merged.mkdir()
    for file in path.iterdir():
        (merged / file.name).write_bytes(file.read_bytes())
    config = json.loads((merged / "config.json").read_text())
    (merged / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForCausalLM"]}))
    torch.testing.assert_close(_load(strip_rollout_head(merged, tmp_path / "kept2"))(tokens).logits,
                               _load(tiny_task["model"])(tokens).logits)


# ---- how far pi_roll is from pi_base ------------------------------------------------------------------------------
def test_the_head_gap_of_one_position_by_hand():
    # z = (0, 0), z + delta = (ln 3, 0): pi_base = (1/2, 1/2), pi_roll = (3/4, 1/4)
    base = torch.zeros(1, 2)
    roll = torch.tensor([[math.log(3.0), 0.0]])
    kl, spread = head_gap_rows(base, roll)
    assert kl.item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), abs=1e-7)  # 0.1308
    assert spread.item() == pytest.approx(math.log(3.0), abs=1e-6)
    shifted_kl, shifted_spread = head_gap_rows(base + 5.0, roll - 2.0)  # a common shift changes neither
    torch.testing.assert_close((shifted_kl, shifted_spread), (kl, spread))
    zero_kl, zero_spread = head_gap_rows(base, base)
    assert zero_kl.item() == 0.0 and zero_spread.item() == 0.0


def test_the_response_mean_picks_the_positions_that_predict_response_tokens():
    prompts, responses = torch.tensor([2, 3]), torch.tensor([2, 1])
    # packed: sequence 0 is positions 0-3 (its response predicted at 1, 2), sequence 1 positions 4-7 (at 6); the
    # packing pads the end with one position
    packed = torch.arange(9, dtype=torch.float32).unsqueeze(0)
    assert response_mean(packed, prompts, responses).item() == pytest.approx((1 + 2 + 6) / 3)
    # padded: a row each from its first column, 5 columns: row 0 at 1, 2; row 1 at 5 + 2 = 7
    padded = torch.arange(10, dtype=torch.float32).reshape(2, 5)
    assert response_mean(padded, prompts, responses).item() == pytest.approx((1 + 2 + 7) / 3)
    # a slice of the sequences (sequence parallelism), no response token, a layout of another batch: no measure
    assert response_mean(packed[:, :6], prompts, responses) is None
    assert response_mean(padded, prompts, torch.tensor([0, 0])) is None
    assert response_mean(torch.zeros(3, 5), prompts, responses) is None


def _hand_head(model, weight: float = 2.0):
    """W1 = I, W2 zero but row 5 all ``weight``: delta_t = (0, ..., 0, weight * sum_j ReLU(h_t,j), 0, ...)."""
    head = model.rollout_head
    with torch.no_grad():
        head.layer1.weight.copy_(torch.eye(head.layer1.weight.shape[0]))
        head.layer2.weight.zero_()
        head.layer2.weight[5] = weight


def _expected_gap(model, tokens, positions, weight: float = 2.0):
    """KL(pi_roll || pi_base) and the residual's range at ``positions``, from the closed form of a residual on one
    token: with p = pi_base(5) and d = delta_5, pi_roll(5) = q = p e^d / (1 + p (e^d - 1)) and
    KL = q d - ln(1 + p (e^d - 1)); the range is d (every other entry 0, d > 0)."""
    with torch.no_grad(), model.select_logits_head("base"):
        p = torch.softmax(model(tokens).logits.double(), dim=-1)[..., 5].reshape(-1)[positions]
    hidden = model.model(tokens).last_hidden_state.double().detach()
    d = (weight * torch.relu(hidden).sum(dim=-1)).reshape(-1)[positions]
    z = 1 + p * (torch.exp(d) - 1)
    q = p * torch.exp(d) / z
    return float((q * d - torch.log(z)).mean()), float(d.mean())


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_model_measures_the_head_gap_on_the_response_tokens_with_either_head(head_model, layout):
    model = _load(head_model)
    _hand_head(model)
    prompts, responses = torch.tensor([2, 3]), torch.tensor([3, 1])
    if layout == "padded":  # right-padded rows; the padding's positions take no part
        tokens = torch.tensor([[5, 6, 7, 8, 9, 0], [11, 12, 13, 14, 0, 0]])
        positions = [1, 2, 3, 6 + 3 - 1]
    else:  # one row, the sequences one after another
        tokens = torch.tensor([[5, 6, 7, 8, 9, 11, 12, 13, 14]])
        positions = [1, 2, 3, 5 + 3 - 1]
    kl, spread = _expected_gap(model, tokens, positions)
    assert kl > 1e-3 and spread > 0.1
    for head in ("roll", "base"):
        with model.select_logits_head(head), model.measuring_head_gap() as gap:
            logits = model(tokens).logits
            measured = gap(prompts, responses)
        assert set(measured) == {HEAD_KL, HEAD_LOGIT_GAP}
        assert measured[HEAD_KL] == pytest.approx(kl, rel=1e-5), head
        assert measured[HEAD_LOGIT_GAP] == pytest.approx(spread, rel=1e-5), head
        with model.select_logits_head(head):
            torch.testing.assert_close(logits, model(tokens).logits, rtol=0, atol=0)  # measured or not: the same
    assert model._head_gap is None  # kept only while measuring


def test_measuring_leaves_the_gradients_as_they_were(head_model):
    model = _load(head_model)
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])
    grads = {}
    for measure in (False, True):
        model.zero_grad(set_to_none=True)
        with contextlib.ExitStack() as stack:
            gap = stack.enter_context(model.measuring_head_gap()) if measure else None
            model(tokens).logits.logsumexp(-1).sum().backward()
            if gap is not None:
                assert gap(torch.tensor([2]), torch.tensor([4]))[HEAD_KL] > 0
        grads[measure] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads[True]) == {"rollout_head.layer1.weight", "rollout_head.layer2.weight"}
    for name in grads[False]:
        torch.testing.assert_close(grads[True][name], grads[False][name], rtol=0, atol=0)
    model.zero_grad(set_to_none=True)
    with model.select_logits_head("base"), model.measuring_head_gap():  # the base head's pass computes the residual
        model(tokens).logits.logsumexp(-1).sum().backward()              # for the measure only: the head learns nothing
    assert not any(p.grad is not None for n, p in model.named_parameters() if n.startswith("rollout_head."))


def test_the_source_start_perturbs_the_logits_and_reset_adaptors_does_not(tiny_task, tmp_path):
    """The released script's effective start (0.02) moves pi_roll off pi_base from the first step; reset_adaptor's
    1e-6 leaves delta under float32's resolution of the logits (z + delta == z)."""
    from recipe_apo.methods.r2po.model import INIT_STD, RESET_STD, add_rollout_head

    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])
    measured = {}
    for std in (INIT_STD, RESET_STD):
        model = _load(add_rollout_head(tiny_task["model"], tmp_path / f"{std:g}", std=std))
        with model.measuring_head_gap() as gap:
            model(tokens)
            measured[std] = gap(torch.tensor([2]), torch.tensor([4]))
    assert INIT_STD == 0.02 and RESET_STD == 1e-6
    assert measured[INIT_STD][HEAD_KL] > 1e-6 and measured[INIT_STD][HEAD_LOGIT_GAP] > 1e-3
    assert measured[RESET_STD][HEAD_LOGIT_GAP] < 1e-6 and measured[RESET_STD][HEAD_KL] < 1e-10
