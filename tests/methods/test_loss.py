"""The APO policy losses: the paper's gate (``apo``) by an independent formula, gradients, bounds and aggregation;
the one-sided gate (``apo_one_sided``) by hand on each side of r = 1 for both signs of A."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import FSDPActorConfig, PolicyLossConfig

from recipe_apo.methods.apo.loss import compute_policy_loss_apo, compute_policy_loss_apo_one_sided

# L0 differs from the padded width on purpose: verl's fallback when L0 is unset is the width.
WIDTH = 8
L0 = 24


def actor_config(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=L0, tau_pos=1.0, tau_neg=1.5,
                 loss_mode="apo"):
    return FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=2,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
        tau_pos=tau_pos,
        tau_neg=tau_neg,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )


LOSSES = {"apo": compute_policy_loss_apo, "apo_one_sided": compute_policy_loss_apo_one_sided}


def apo_loss(log_prob, old_log_prob, advantages, mask, config, weights=None):
    return LOSSES[config.policy_loss.loss_mode](
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=weights,
    )


def paper_objective(log_ratios, advantages, lengths, tau_pos, tau_neg, l0):
    """-(1/G) sum_i (1/L0) sum_t (4/tau_i) sigmoid(tau_i (r - 1)) A_i, with plain Python floats."""
    total = 0.0
    for row, a, n in zip(log_ratios, advantages, lengths):
        tau = tau_pos if a > 0 else tau_neg
        total += sum(4 / tau / (1 + math.exp(-tau * (math.exp(x) - 1))) * a for x in row[:n]) / l0
    return -total / len(lengths)


def batch(lengths, advantages, width=WIDTH, log_ratio=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    old = -torch.rand(len(lengths), width, generator=gen) * 3
    delta = (torch.rand(len(lengths), width, generator=gen) - 0.5) * 0.8 if log_ratio is None else log_ratio
    log_prob = (old + delta).requires_grad_(True)
    adv = torch.tensor(advantages, dtype=torch.float32).unsqueeze(-1) * mask
    return log_prob, old, adv, mask


@pytest.mark.parametrize("mode", LOSSES)
def test_registered_under_its_mode(mode):
    assert get_policy_loss_fn(mode) is LOSSES[mode]


def test_value_equals_the_papers_objective():
    lengths, advantages = [8, 3, 5, 1], [1.25, -0.5, 0.75, -2.0]
    log_prob, old, adv, mask = batch(lengths, advantages)
    loss, _ = apo_loss(log_prob, old, adv, mask, actor_config())
    expected = paper_objective((log_prob - old).tolist(), advantages, lengths, 1.0, 1.5, L0)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@hsettings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=WIDTH), min_size=1, max_size=6),
    scale=st.floats(min_value=-3, max_value=3),
    tau_pos=st.floats(min_value=0.3, max_value=3.0),
    tau_neg=st.floats(min_value=0.3, max_value=3.0),
)
def test_on_policy_gradient_is_minus_a_over_g_l0_for_every_valid_token(lengths, scale, tau_pos, tau_neg):
    advantages = [scale * (i + 1) * (-1) ** i for i in range(len(lengths))]
    log_prob, old, adv, mask = batch(lengths, advantages, log_ratio=torch.zeros(len(lengths), WIDTH))
    loss, _ = apo_loss(log_prob, old, adv, mask, actor_config(tau_pos=tau_pos, tau_neg=tau_neg))
    loss.backward()
    groups = sum(1 for n in lengths if n > 0)  # verl's seq-mean counts responses with a valid token
    expected = -adv / max(groups, 1) / L0
    torch.testing.assert_close(log_prob.grad, expected * mask, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("log_ratio", [60.0, -60.0, 19.0, -19.0])
def test_bounded_loss_and_vanishing_gradients_far_off_policy(log_ratio):
    lengths, advantages = [8, 8], [3.0, -3.0]
    log_prob, old, adv, mask = batch(lengths, advantages, log_ratio=torch.full((2, WIDTH), log_ratio))
    config = actor_config()
    loss, metrics = apo_loss(log_prob, old, adv, mask, config)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_prob.grad).all()
    # |f| <= 4 / tau for every token, so |loss| <= max |A| * (4 / min tau) * (tokens per response / L0).
    assert abs(loss.item()) <= 3.0 * 4 / 1.0 * WIDTH / L0 + 1e-6
    # The gate's point: a token far from on-policy stops pulling (the on-policy gradient is |A| / (G L0) = 0.0625).
    assert log_prob.grad.abs().max() < 1e-6
    assert metrics["actor/apo_ratio_out_share"] == 1.0
    # w(r) is df/dr: it vanishes for r >> 1 but not for r -> 0, where the gradient dies through dr/dlog_prob = r.
    s_pos, s_neg = (1 / (1 + math.exp(-tau * (math.exp(max(min(log_ratio, 20), -20)) - 1))) for tau in (1.0, 1.5))
    expected_weight = (4 * s_pos * (1 - s_pos) + 4 * s_neg * (1 - s_neg)) / 2
    assert metrics["actor/apo_gate_weight"] == pytest.approx(expected_weight, abs=1e-6)


def test_temperature_is_picked_by_the_sign_of_the_advantage():
    positive = batch([6, 4], [1.0, 2.0])
    negative = batch([6, 4], [-1.0, -2.0])
    base = actor_config(tau_pos=0.8, tau_neg=1.6)
    other_neg = actor_config(tau_pos=0.8, tau_neg=0.5)
    other_pos = actor_config(tau_pos=1.9, tau_neg=1.6)
    assert apo_loss(*positive, base)[0].item() == apo_loss(*positive, other_neg)[0].item()
    assert apo_loss(*positive, base)[0].item() != apo_loss(*positive, other_pos)[0].item()
    assert apo_loss(*negative, base)[0].item() == apo_loss(*negative, other_pos)[0].item()
    assert apo_loss(*negative, base)[0].item() != apo_loss(*negative, other_neg)[0].item()


@pytest.mark.parametrize("mode", LOSSES)
def test_micro_batches_sum_to_the_global_batch_loss_and_gradient(mode):
    lengths, advantages = [8, 2, 5, 7], [1.0, -0.5, 0.25, -1.5]
    log_prob, old, adv, mask = batch(lengths, advantages)
    config = actor_config(loss_mode=mode)
    full, _ = apo_loss(log_prob, old, adv, mask, config)
    (full_grad,) = torch.autograd.grad(full, log_prob)

    config.global_batch_info.update(dp_size=1, global_batch_size=4, batch_num_tokens=int(mask.sum()))
    parts = []
    for rows in (slice(0, 1), slice(1, 4)):
        lp = log_prob.detach()[rows].clone().requires_grad_(True)
        loss, _ = apo_loss(lp, old[rows], adv[rows], mask[rows], config)
        (grad,) = torch.autograd.grad(loss, lp)
        parts.append((loss, grad))
    assert sum(p[0] for p in parts).item() == pytest.approx(full.item(), rel=1e-6)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad)


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def test_other_aggregation_modes_are_honoured():
    lengths, advantages = [8, 2, 5], [1.0, -0.5, 0.25]
    log_prob, old, adv, mask = batch(lengths, advantages)
    ratio = torch.exp(log_prob - old)
    tau = torch.where(adv > 0, 1.0, 1.5)
    per_token = -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * adv
    m = mask.float()
    expected = {
        "token-mean": masked_mean(per_token, m),
        "token-sum": (per_token * m).sum(),
        "seq-mean-token-sum": (per_token * m).sum(-1).mean(),
        "seq-mean-token-mean": ((per_token * m).sum(-1) / m.sum(-1)).mean(),
        "seq-mean-token-sum-norm": (per_token * m).sum(-1).mean() / L0,  # L0 = 24, not the width 8
    }
    for mode, value in expected.items():
        loss, _ = apo_loss(log_prob, old, adv, mask, actor_config(loss_agg_mode=mode))
        assert loss.item() == pytest.approx(value.item(), rel=1e-5), mode


def test_rollout_importance_weights_scale_each_token():
    log_prob, old, adv, mask = batch([8, 4], [1.0, -1.0])
    weights = torch.rand(2, WIDTH, generator=torch.Generator().manual_seed(3))
    config = actor_config(loss_agg_mode="token-sum")
    weighted, _ = apo_loss(log_prob, old, adv, mask, config, weights)
    ratio = torch.exp(log_prob - old)
    tau = torch.where(adv > 0, 1.0, 1.5)
    expected = (-(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * adv * weights * mask).sum()
    assert weighted.item() == pytest.approx(expected.item(), rel=1e-5)


def test_missing_l0_for_the_constant_norm_mode_is_refused():
    log_prob, old, adv, mask = batch([8, 4], [1.0, -1.0])
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.loss_scale_factor"):
        apo_loss(log_prob, old, adv, mask, actor_config(loss_scale_factor=None))
    # Other modes do not use L0.
    apo_loss(log_prob, old, adv, mask, actor_config(loss_agg_mode="token-mean", loss_scale_factor=None))


@pytest.mark.parametrize("mode", LOSSES)
@pytest.mark.parametrize("key, value, said", [("tau_pos", 0.0, ">= 0.001"), ("tau_neg", -1.0, ">= 0.001"),
                                              ("tau_pos", 1e-39, ">= 0.001"), ("tau_neg", 1e-4, ">= 0.001"),
                                              ("tau_pos", 1e4, "<= 1000.0")])
def test_a_temperature_that_would_break_the_gate_is_refused(key, value, said, mode):
    """Below about 1e-38 the gate's loss is NaN (1e-40: -inf); the bounds stop well before."""
    log_prob, old, adv, mask = batch([8], [1.0])
    with pytest.raises(ValueError, match=rf"^actor_rollout_ref.actor.{key} \(loss_mode={mode}\) must be {said}"):
        apo_loss(log_prob, old, adv, mask, actor_config(**{key: value}, loss_mode=mode))


@pytest.mark.parametrize("mode", LOSSES)
def test_the_bounds_give_a_finite_loss_and_gradient(mode):
    log_ratio = torch.full((2, WIDTH), 3.0)
    for tau_pos, tau_neg, l0 in ((1e-3, 1e-3, 1.0), (1e3, 1e3, 1e7)):
        log_prob, old, adv, mask = batch([8, 4], [1.0, -1.0], log_ratio=log_ratio)
        log_prob.requires_grad_(True)
        config = actor_config(tau_pos=tau_pos, tau_neg=tau_neg, loss_mode=mode)
        object.__setattr__(config, "global_batch_info", {"loss_scale_factor": l0})
        loss, _ = apo_loss(log_prob, old, adv, mask, config)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(log_prob.grad).all()


def test_gate_metrics_by_hand():
    # Response 0 on-policy (r = 1); response 1 with r = e^0.5 on 2 of its 4 tokens and r = 1 on the others.
    log_ratio = torch.zeros(2, WIDTH)
    log_ratio[1, :2] = 0.5
    log_prob, old, adv, mask = batch([4, 4], [1.0, -1.0], log_ratio=log_ratio)
    _, metrics = apo_loss(log_prob, old, adv, mask, actor_config(tau_pos=1.0, tau_neg=4.0))
    s = 1 / (1 + math.exp(-4.0 * (math.exp(0.5) - 1)))  # tau_neg on the negative response
    w = 4 * s * (1 - s)
    assert metrics["actor/apo_gate_weight"] == pytest.approx((6 + 2 * w) / 8, rel=1e-5)
    assert metrics["actor/apo_gate_low_share"] == pytest.approx(2 / 8 if w < 0.5 else 0.0)
    assert w < 0.5
    assert metrics["actor/apo_ratio_out_share"] == pytest.approx(2 / 8)  # e^0.5 = 1.65 > 1.2
    assert metrics["actor/ppo_kl"] == pytest.approx(-2 * 0.5 / 8, rel=1e-5)
    assert not any("max" in k or "min" in k for k in metrics)  # verl reduces by substrings of the name


@pytest.mark.parametrize("mode", LOSSES)
@pytest.mark.parametrize("value", [-24, 0, 0.0, 1e-40, 0.5, 1e300, float("nan"), float("inf"), True, "24"])
def test_an_unusable_l0_is_refused_by_the_loss_itself(value, mode):
    """Plain verl passes loss_scale_factor through unchecked: the loss must refuse what would flip or blow it up."""
    log_prob, old, adv, mask = batch([8, 4], [1.0, -1.0])
    config = actor_config(loss_mode=mode)
    # As verl's ppo_loss hands it over, per micro-batch.
    object.__setattr__(config, "global_batch_info", {"loss_scale_factor": value})
    message = (rf"^actor_rollout_ref.actor.loss_scale_factor \(L0, loss_mode={mode}\) "
               r"must be (a finite number|>= 1.0|<= 10000000.0), got")
    with pytest.raises(ValueError, match=message):
        apo_loss(log_prob, old, adv, mask, config)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_log_probs_far_off_policy_give_finite_gradients_equal_to_float32(dtype):
    log_ratio = torch.full((2, WIDTH), 12.0)
    log_prob, old, adv, mask = batch([8, 5], [1.0, -1.0], log_ratio=log_ratio)
    half = log_prob.detach().to(dtype).requires_grad_(True)
    loss, _ = apo_loss(half, old.to(dtype), adv.to(dtype), mask, actor_config())
    loss.backward()
    reference = half.detach().float().requires_grad_(True)
    expected, _ = apo_loss(reference, old.to(dtype).float(), adv.to(dtype).float(), mask, actor_config())
    expected.backward()
    assert torch.isfinite(loss) and torch.isfinite(half.grad).all()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(half.grad.float(), reference.grad.to(dtype).float())


# --- the one-sided gate -------------------------------------------------------------------------------------------
# One token per response, token-sum: the loss is sum_i -g(r_i) A_i. tau_+ = 1, tau_- = 1.5. Worked by hand
# (s = sigmoid(tau (r - 1)), g = (4 / tau)(s - 1/2) + 1 on the gated side, g = r on the other):
#   A = +1, r = e^0.5  = 1.648721 (moved with A: gated): s = sigmoid(0.648721) = 0.656722, g = 1.626889
#   A = +1, r = e^-0.5 = 0.606531 (moved against A):    g = r = 0.606531
#   A = -2, r = e^-0.5 (with A: gated):   s = sigmoid(-0.590204) = 0.356588, g = (4/1.5)(-0.143412) + 1 = 0.617568
#   A = -2, r = e^0.5  (against A):       g = r = 1.648721
# Gradients d loss / d log pi = -A r g'(r), g' = 4 s (1 - s) gated, 1 otherwise:
#   -1.486739, -0.606531, +1.113265, +3.297443.
ONE_SIDED_CASES = [  # (A, log r, loss, gradient)
    (1.0, 0.5, -1.626889, -1.486739),
    (1.0, -0.5, -0.606531, -0.606531),
    (-2.0, -0.5, 1.235136, 1.113265),
    (-2.0, 0.5, 3.297443, 3.297443),
]


def one_token_batch(advantages, log_ratios):
    old = torch.full((len(advantages), 1), -1.0)
    log_prob = (old + torch.tensor(log_ratios).unsqueeze(-1)).requires_grad_(True)
    return log_prob, old, torch.tensor(advantages).unsqueeze(-1), torch.ones(len(advantages), 1, dtype=torch.bool)


@pytest.mark.parametrize("case", ONE_SIDED_CASES, ids=["A>0,r>1", "A>0,r<1", "A<0,r<1", "A<0,r>1"])
def test_one_sided_gate_by_hand_on_each_side_of_one_for_both_signs(case):
    advantage, log_ratio, expected_loss, expected_grad = case
    log_prob, old, adv, mask = one_token_batch([advantage], [log_ratio])
    config = actor_config(loss_agg_mode="token-sum", loss_mode="apo_one_sided")
    loss, metrics = apo_loss(log_prob, old, adv, mask, config)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, abs=2e-6)
    assert log_prob.grad.item() == pytest.approx(expected_grad, abs=2e-6)
    assert metrics["actor/apo_gate_active_share"] == (1.0 if advantage * log_ratio > 0 else 0.0)


def test_one_sided_gate_metrics_by_hand():
    # The four tokens above: gated weights 4 s (1 - s) = 0.901753 and 0.917732 (both >= 0.5), 1 elsewhere.
    advantages, log_ratios = [c[0] for c in ONE_SIDED_CASES], [c[1] for c in ONE_SIDED_CASES]
    log_prob, old, adv, mask = one_token_batch(advantages, log_ratios)
    config = actor_config(loss_agg_mode="token-sum", loss_mode="apo_one_sided")
    loss, metrics = apo_loss(log_prob, old, adv, mask, config)
    assert loss.item() == pytest.approx(sum(c[2] for c in ONE_SIDED_CASES), abs=1e-5)
    assert metrics["actor/apo_gate_weight"] == pytest.approx((0.901753 + 1 + 0.917732 + 1) / 4, abs=1e-6)
    assert metrics["actor/apo_gate_active_share"] == 0.5
    assert metrics["actor/apo_gate_low_share"] == 0.0
    assert metrics["actor/apo_ratio_out_share"] == 1.0  # e^+-0.5 are outside [0.8, 1.2]
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-7)


def test_one_sided_gate_far_off_policy_stops_only_the_tokens_that_moved_with_their_advantage():
    # r = e^3 for A > 0 (gated: its pull vanishes) and for A < 0 (against: it keeps the full restoring gradient,
    # -A r, where the symmetric gate gives about 0).
    log_prob, old, adv, mask = one_token_batch([1.0, -1.0], [3.0, 3.0])
    one_sided = actor_config(loss_agg_mode="token-sum", loss_mode="apo_one_sided")
    loss, metrics = apo_loss(log_prob, old, adv, mask, one_sided)
    loss.backward()
    assert abs(log_prob.grad[0].item()) < 1e-4
    assert log_prob.grad[1].item() == pytest.approx(math.exp(3.0), rel=1e-6)
    symmetric = log_prob.detach().clone().requires_grad_(True)
    apo_loss(symmetric, old, adv, mask, actor_config(loss_agg_mode="token-sum"))[0].backward()
    assert abs(symmetric.grad[1].item()) < 1e-4
    assert metrics["actor/apo_gate_low_share"] == 0.5  # the gated token only


@hsettings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=WIDTH), min_size=1, max_size=6),
    scale=st.floats(min_value=-3, max_value=3),
    spread=st.floats(min_value=0.0, max_value=3.0),
    tau_pos=st.floats(min_value=0.3, max_value=3.0),
    tau_neg=st.floats(min_value=0.3, max_value=3.0),
)
def test_one_sided_gradient_is_the_gates_where_gated_and_the_plain_ratios_elsewhere(lengths, scale, spread, tau_pos,
                                                                                 tau_neg):
    """For every token: d/d log pi of the one-sided loss equals the symmetric gate's where (r - 1) A > 0 (g and f
    differ by a constant there) and the unclipped -r A's elsewhere, under APO's 1/L0 aggregation."""
    advantages = [scale * (i + 1) * (-1) ** i for i in range(len(lengths))]
    log_ratio = (torch.rand(len(lengths), WIDTH, generator=torch.Generator().manual_seed(len(lengths))) - 0.5) * spread
    log_prob, old, adv, mask = batch(lengths, advantages, log_ratio=log_ratio)
    grads = {}
    for mode in LOSSES:
        lp = log_prob.detach().clone().requires_grad_(True)
        apo_loss(lp, old, adv, mask, actor_config(tau_pos=tau_pos, tau_neg=tau_neg, loss_mode=mode))[0].backward()
        grads[mode] = lp.grad
    ratio = torch.exp(log_prob.detach() - old)
    groups = max(sum(1 for n in lengths if n > 0), 1)
    plain = -ratio * adv / groups / L0 * mask
    gated = (ratio - 1) * adv > 0
    torch.testing.assert_close(grads["apo_one_sided"], torch.where(gated, grads["apo"], plain), atol=1e-7, rtol=1e-5)
