"""AGPO with dual statistical feedback in the testbed (``method=agpo_dual``, its runtime driven by the testbed): each
prompt's temperature reaches the sampler, each prompt's clip reaches its loss rows, the KL loss is verl's, a
round's probe, temperatures, clips and KL_bar recomputed by independent formulas, the answer keys of both tasks,
the league's equal-generation entries, and determinism."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest
import torch
from helpers.testbed_tiny import TINY_RUN
from hydra import initialize_config_module

from recipe_apo.testbed.errors import TestbedSettingError

# A modsum run of seconds: a random policy solves K = 2 half the time, so the probe's groups have a spread.
TINY_MODSUM = [*TINY_RUN, "seeds=[0]", "task=modsum", "task.moduli=[2,4]", "method=agpo_dual"]


@pytest.fixture(scope="module")
def hydra_ctx():
    import recipe_apo.testbed.configs  # noqa: F401  (stores the settings' defaults that testbed.yaml composes)

    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        yield


def _compose(overrides):
    from hydra import compose

    return compose(config_name="testbed", overrides=overrides)


# --- the sampler at a temperature per row ------------------------------------------------------------------------

def _two_token_policy(gap: float):
    """A policy whose every step is the same distribution over two tokens, EOS and FILL, with logits gap and 0
    (the others held at -1e9; PAD and SEP banned): sampling one token at tau draws EOS with probability
    sigmoid(gap / tau)."""
    from recipe_apo.testbed.policy import TokenPolicy
    from recipe_apo.testbed.task import EOS, FILL

    policy = TokenPolicy(vocab_size=6, embed_dim=2, hidden_dim=2, layers=1)
    with torch.no_grad():
        policy.head.weight.zero_()
        policy.head.bias.fill_(-1e9)
        policy.head.bias[EOS], policy.head.bias[FILL] = gap, 0.0
    return policy


def test_the_sampler_draws_each_row_from_softmax_of_its_logits_over_its_temperature():
    from recipe_apo.testbed.task import EOS

    policy = _two_token_policy(gap=1.0)
    taus = torch.tensor([0.5, 1.0, 2.0]).repeat_interleave(10_000)
    prompts = torch.zeros(len(taus), 1, dtype=torch.int64)
    drawn = policy.sample(prompts, 1, torch.Generator().manual_seed(3), temperature=taus)[:, 0]
    # The same draws as multinomial on softmax(logits / tau), the definition, from the same stream.
    logits = policy.head.bias.detach() + policy.banned
    expected = torch.multinomial(torch.softmax(logits.expand(len(taus), -1) / taus.unsqueeze(1), dim=-1), 1,
                                 generator=torch.Generator().manual_seed(3))[:, 0]
    assert torch.equal(drawn, expected)
    # And the frequencies are sigmoid(1 / tau): 0.881, 0.731, 0.622, within 4.5 standard errors.
    for i, tau in enumerate((0.5, 1.0, 2.0)):
        p = 1.0 / (1.0 + math.exp(-1.0 / tau))
        share = float((drawn[i * 10_000:(i + 1) * 10_000] == EOS).float().mean())
        assert abs(share - p) < 4.5 * math.sqrt(p * (1 - p) / 10_000), (tau, share, p)
    # Without a temperature: temperature 1, the draws of the policy as it always sampled.
    plain = policy.sample(prompts[:100], 1, torch.Generator().manual_seed(5))
    ones = policy.sample(prompts[:100], 1, torch.Generator().manual_seed(5), temperature=torch.ones(100))
    assert torch.equal(plain, ones)
    with pytest.raises(ValueError, match="temperature needs one finite value > 0 per row"):
        policy.sample(prompts[:2], 1, torch.Generator(), temperature=torch.tensor([1.0, 0.0]))


def test_rollout_draws_each_prompts_group_at_the_prompts_temperature():
    from recipe_apo.testbed.rollout import rollout
    from recipe_apo.testbed.task import EOS, ReverseTask

    task = ReverseTask(alphabet=2, min_len=1, max_len=1, max_response_length=2, filler_mean=0.0)
    policy = _two_token_policy(gap=1.0)
    prompts, k = task.sample_prompts(2, torch.Generator().manual_seed(0))
    batch = rollout(policy, task, prompts, k, 10_000, torch.Generator().manual_seed(1), torch.tensor([0.5, 2.0]))
    first = (batch["responses"][:, 0] == EOS).float().view(2, -1).mean(dim=1)
    for share, tau in zip(first.tolist(), (0.5, 2.0)):
        p = 1.0 / (1.0 + math.exp(-1.0 / tau))
        assert abs(share - p) < 4.5 * math.sqrt(p * (1 - p) / 10_000), (tau, share)


def test_the_token_entropy_is_the_unscaled_distributions():
    from recipe_apo.testbed.policy import build_policy
    from recipe_apo.testbed.task import ReverseTask

    task = ReverseTask(alphabet=4, min_len=1, max_len=3, max_response_length=6, filler_mean=1.0)
    policy = build_policy(task, 8, 8, 1, seed=0)
    prompts, k = task.sample_prompts(5, torch.Generator().manual_seed(0))
    responses = policy.sample(prompts, 6, torch.Generator().manual_seed(1))
    log_probs, entropy = policy.log_probs_and_entropy(prompts, responses)
    assert torch.equal(log_probs, policy.log_probs(prompts, responses))  # the same numbers as before
    logits, _ = policy.step_logits(torch.cat([prompts, responses[:, :-1]], dim=1))
    reference = torch.distributions.Categorical(logits=logits[:, prompts.shape[1] - 1:]).entropy()
    torch.testing.assert_close(entropy, reference, rtol=0, atol=1e-6)
    assert torch.isfinite(entropy).all()  # the banned tokens' -inf add nothing


# --- the clip of each row and the KL loss, in the update ---------------------------------------------------------

class _Table(torch.nn.Module):
    """log pi = theta[row] at every position, the prompt's first token naming the row."""

    def __init__(self, rows: int, width: int) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(rows, width))

    def log_probs(self, prompts, responses):
        return self.theta[prompts[:, 0]]


def _hand_update(overrides, clip_eps, old_shift, ref_shift=None, lengths=(2, 3, 1, 2)):
    """One ppo_update at learning rate 0 of a hand batch of 2 prompts x 2 responses (all advantages +1), in one
    mini-batch of two micro-batches; log pi_old = log pi - old_shift (ratio e^old_shift), log pi_ref =
    log pi - ref_shift. Returns the metrics and theta's gradient."""
    from recipe_apo.testbed.update import actor_config, ppo_update

    cfg = _compose(["method=agpo_dual", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.grad_clip=1e9",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", *overrides])
    actor = actor_config(cfg.actor_rollout_ref.actor, 2)
    n, width = len(lengths), 4
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    batch = {"prompts": torch.arange(n).unsqueeze(1), "responses": torch.zeros(n, width, dtype=torch.int64),
             "response_mask": mask, "uid": np.repeat(np.array(["g0", "g1"], dtype=object), 2)}
    policy = _Table(n, width)
    current = policy.log_probs(batch["prompts"], batch["responses"]).detach()
    ref = None if ref_shift is None else current - ref_shift
    metrics = ppo_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), actor, batch, mask.clone(),
                         current - old_shift, torch.Generator().manual_seed(0),
                         loss_columns={"agpo_dual_clip_eps": clip_eps}, ref_log_prob=ref)
    return metrics, policy.theta.grad.clone(), mask


def test_each_row_is_clipped_at_its_own_eps_micro_batch_by_micro_batch():
    """Ratio e^0.2 = 1.221 on every token, advantage +1: a row with eps 0.1 is clipped (no gradient), a row with
    eps 0.3 is not: its token t gets -r / (|o_i| x 4 responses) under seq-mean-token-mean. The second micro-batch
    (rows 2, 3) must get eps[2:4], not the first micro-batch's."""
    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        import recipe_apo.testbed.configs  # noqa: F401

        eps = torch.tensor([0.1, 0.3, 0.3, 0.1])
        metrics, grad, mask = _hand_update(["actor_rollout_ref.actor.use_kl_loss=false"], eps, old_shift=0.2)
    r = math.exp(0.2)
    lengths = mask.sum(dim=1)
    expected = torch.zeros_like(grad)
    for row in (1, 2):
        expected[row] = -r / (lengths[row] * 4) * mask[row]
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-6)
    # The loss: clipped rows at -(1 + 0.1), the others at -r, averaged over the 4 responses.
    assert metrics["pg_loss"] == pytest.approx(-(2 * 1.1 + 2 * r) / 4, abs=1e-6)
    # agpo_clip's own metric, the mean eps over valid tokens per micro-batch, averaged over the two.
    per_micro = [(0.1 * 2 + 0.3 * 3) / 5, (0.3 * 1 + 0.1 * 2) / 3]
    assert metrics["actor/agpo_dual_clip_eps_mean"] == pytest.approx(sum(per_micro) / 2, abs=1e-6)


def test_the_kl_loss_is_verls_k1_against_the_reference_aggregated_as_the_policy_loss():
    """use_kl_loss with k1 at coefficient 0.03 (the preset): log pi - log pi_ref = 0.5 on every token, so the KL
    loss is 0.5 and adds 0.03 x 0.5 to the loss; at ratio 1 with eps 0.2 nothing is clipped, and each token's
    gradient is (-1 + 0.03) / (|o_i| x 4)."""
    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        import recipe_apo.testbed.configs  # noqa: F401

        metrics, grad, mask = _hand_update([], torch.full((4,), 0.2), old_shift=0.0, ref_shift=0.5)
        with pytest.raises(ValueError, match="use_kl_loss=true needs the reference policy's log-probs"):
            _hand_update([], torch.full((4,), 0.2), old_shift=0.0)
    assert metrics["actor/kl_loss"] == pytest.approx(0.5, abs=1e-6)  # the mini-batch's: 0.25 + 0.25
    assert metrics["pg_loss"] == pytest.approx(-1.0 + 0.03 * 0.5, abs=1e-6)
    lengths = mask.sum(dim=1, keepdim=True)
    torch.testing.assert_close(grad, (-1.0 + 0.03) / (lengths * 4) * mask, rtol=0, atol=1e-7)


# --- a round, recomputed -----------------------------------------------------------------------------------------

def _vote_entropy(keys) -> float:
    counts = collections.Counter(keys)
    return -sum(c / len(keys) * math.log(c / len(keys)) for c in counts.values())


def test_a_round_probes_tempers_clips_and_moves_kl_bar_as_the_formulas_say(hydra_ctx):
    from recipe_apo.testbed.policy import build_policy
    from recipe_apo.testbed.rollout import rollout
    from recipe_apo.testbed.train import _PROBE, _SAMPLING, MethodRun, generator, prepare_seed

    cfg = _compose(TINY_MODSUM)
    s = cfg.algorithm.agpo_dual
    G = cfg.actor_rollout_ref.rollout.n
    assert s.probe_samples == G == 4  # the probe's G is the scenario's rollout.n
    setup = prepare_seed(cfg, 0)
    run = MethodRun(cfg, setup)
    seen = {}
    (agpo,) = [r for r in run.runtimes if r.method.name == "agpo_dual"]
    drew, after = agpo.drew_prompts, agpo.after_advantage
    agpo.drew_prompts = lambda *a: seen.setdefault("settings", drew(*a))
    agpo.after_advantage = lambda *a: seen.setdefault("out", after(*a))
    run.train_round(0, on_round=lambda r, batch, old, adv: seen.update(batch=batch, old=old))
    seen["tau"] = torch.from_numpy(seen["settings"]["temperature"]).to(torch.float32)
    seen["eps_rows"] = torch.from_numpy(seen["out"].loss_columns["agpo_dual_clip_eps"])
    batch, old = seen["batch"], seen["old"]

    # The probe: G samples per prompt at base_temperature from the round's policy, on the probe's own stream.
    start = build_policy(run.task, cfg.policy.embed_dim, cfg.policy.hidden_dim, cfg.policy.layers, 0)
    start.load_state_dict(setup.init_state)
    prompts, k = setup.train_prompts[0], setup.train_k[0]
    probed = rollout(start, run.task, prompts, k, G, generator(0, _PROBE), torch.full((len(prompts),), 1.0))
    rewards = probed["reward"].double().view(-1, G).numpy()
    keys = run.task.vote_key(probed["prompts"], probed["k"], probed["responses"]).reshape(-1, G)
    sigma = rewards.std(axis=1, ddof=1)
    h_v = np.array([_vote_entropy(list(row)) for row in keys])
    assert sigma.max() > 0 and h_v.max() > 0  # a probe with something to measure
    u = s.weight_dispersion * sigma + s.weight_vote_entropy * h_v
    # tau_t: U_bar starts at the first prompt's U (c = 0), then moves by 0.1 after each prompt.
    u_bar, tau = 0.0, []
    for value in u:
        c = 0.0 if u_bar <= 1e-8 else (value - u_bar) / (u_bar + 1e-8)
        u_bar = value if u_bar <= 1e-8 else 0.1 * value + 0.9 * u_bar
        tau.append(min(max(s.base_temperature * (1 + s.temperature_gain * c), s.min_temperature),
                       s.max_temperature))
    np.testing.assert_allclose(seen["tau"].numpy(), tau, rtol=0, atol=1e-6)
    assert agpo.state.uncertainty_avg == pytest.approx(u_bar, abs=1e-6)  # the source rounds to float32

    # The training responses: drawn at each prompt's tau on the sampling stream every method reads.
    again = rollout(start, run.task, prompts, k, G, generator(0, _SAMPLING), seen["tau"])
    assert torch.equal(again["responses"], batch["responses"])
    torch.testing.assert_close(old, start.log_probs(batch["prompts"], batch["responses"]), rtol=0, atol=0)

    # eps_p from H_pi (the start's token entropy pooled over the prompt's responses), H_ref from the first H_pi.
    logits, _ = start.step_logits(torch.cat([batch["prompts"], batch["responses"][:, :-1]], dim=1))
    entropy = torch.distributions.Categorical(logits=logits[:, batch["prompts"].shape[1] - 1:]).entropy()
    mask = batch["response_mask"]
    h_pi = ((entropy * mask).view(-1, G, mask.shape[1]).sum(dim=(1, 2)) / mask.view(-1, G, mask.shape[1])
            .sum(dim=(1, 2))).detach().numpy()
    h_ref, eps = 0.0, []
    for j, h in enumerate(h_pi):
        ref = h if h_ref <= 1e-8 else h_ref
        h_ref = h if h_ref <= 1e-8 else 0.01 * h + 0.99 * h_ref
        ratio = min(max(h / (ref + 1e-8), s.entropy_ratio_min), s.entropy_ratio_max)
        value = s.clip_base * ratio * (1 + s.clip_vote_entropy * h_v[j]) / (1 + s.clip_dispersion * sigma[j])
        eps.append(min(max(value, s.clip_min), s.clip_max))  # KL_bar is 0 in the first round
    np.testing.assert_allclose(seen["eps_rows"].numpy(), np.repeat(eps, G), rtol=0, atol=1e-5)

    # KL_bar after the update: 0.1 x the mean over prompts of max(pooled logp_old - logp_new, 0).
    with torch.no_grad():
        new = run.policy.log_probs(batch["prompts"], batch["responses"])
    diff = ((old - new) * mask).view(-1, G, mask.shape[1]).sum(dim=(1, 2)) / mask.view(-1, G, mask.shape[1]).sum(
        dim=(1, 2))
    step = float(diff.clamp(min=0).mean())
    assert step > 0
    assert agpo.state.kl_avg == pytest.approx(0.1 * step, rel=1e-5)
    assert run.history["agpo_dual/kl_avg"] == [pytest.approx(0.1 * step, rel=1e-5)]
    # The round's record: the probe's tokens counted in what it generated.
    probe_tokens = float(probed["response_mask"].sum())
    assert run.history["probe_tokens"] == [probe_tokens]
    assert run.history["tokens_generated"] == [probe_tokens + float(mask.sum())]
    assert run.history["agpo_dual/probe_tokens"] == [probe_tokens]
    assert run.history["agpo_dual/temperature_mean"] == [pytest.approx(float(np.mean(tau)), abs=1e-6)]
    assert run.history["agpo_dual/clip_eps_std"] == [pytest.approx(float(np.std(eps)), abs=1e-5)]

    # The next round reads KL_bar in its clips and moves it again.
    run.train_round(1)
    kl = run.history["agpo_dual/kl_avg"]
    assert kl[1] == pytest.approx(0.9 * kl[0] + 0.1 * run.history["agpo_dual/step_kl"][1], rel=1e-9)


def test_an_agpo_run_is_deterministic_for_a_seed_and_records_its_metrics(hydra_ctx):
    from recipe_apo.testbed.train import prepare_seed, run_method

    cfg = _compose(TINY_MODSUM)
    setup = prepare_seed(cfg, 0)
    first = run_method(cfg, "agpo_dual", setup)
    again = run_method(cfg, "agpo_dual", prepare_seed(cfg, 0))
    assert json.dumps(first["history"]) == json.dumps(again["history"])
    assert first["evals"] == again["evals"]
    h = first["history"]
    from recipe_apo.methods import catalog

    # Every metric AGPO declares, every round, finite (a round without one would record NaN).
    for key in [catalog.method("agpo_dual").metric(q) for q in catalog.method("agpo_dual").metrics] + [
            "probe_tokens", "actor/kl_loss", "actor/agpo_dual_clip_eps_mean"]:
        assert len(h[key]) == 4 and all(math.isfinite(v) for v in h[key]), key
    assert all(0.5 <= t <= 1.5 for t in h["agpo_dual/temperature_mean"])
    assert all(0.05 <= e <= 0.4 for e in h["agpo_dual/clip_eps_mean"])
    # Another method of the seed reads the same sampling stream: its first round's prompts and start agree.
    grpo = run_method(_compose([*TINY_MODSUM[:-1], "method=grpo"]), "grpo", setup)
    assert grpo["evals"]["overall"][0] == first["evals"]["overall"][0]
    assert "agpo_dual/temperature_mean" not in grpo["history"] and grpo["history"]["probe_tokens"] == [0.0] * 4


# --- the answer keys ---------------------------------------------------------------------------------------------

def test_the_reversal_key_is_the_answer_without_fillers_and_a_cut_response_votes_for_its_text():
    from recipe_apo.testbed.task import EOS, FILL, FIRST_SYMBOL, PAD, ReverseTask

    task = ReverseTask(alphabet=4, min_len=1, max_len=3, max_response_length=6, filler_mean=1.0)
    a, b = FIRST_SYMBOL, FIRST_SYMBOL + 1
    responses = torch.tensor([
        [b, a, EOS, PAD, PAD, PAD],
        [FILL, b, FILL, a, EOS, PAD],     # the same answer, with fillers
        [a, b, EOS, PAD, PAD, PAD],
        [b, a, FILL, FILL, FILL, FILL],   # cut: no answer
        [EOS, PAD, PAD, PAD, PAD, PAD],   # the empty answer
    ])
    keys = task.vote_key(None, None, responses)
    assert keys.tolist() == ["ba", "ba", "ab", "~ba....", ""]


def test_the_modsum_key_is_the_digit_sum_mod_k_and_an_answerless_response_votes_for_its_text():
    from recipe_apo.testbed.modsum import FIRST_DIGIT, ModSumTask
    from recipe_apo.testbed.task import EOS, FILL, PAD

    task = ModSumTask(moduli=(2, 4), max_response_length=5, filler_mean=0.0, prefix_max=1)
    d = FIRST_DIGIT
    responses = torch.tensor([
        [d + 3, d + 5, EOS, PAD, PAD],              # 8 mod 4
        [d + 8, FILL, EOS, PAD, PAD],               # 8 mod 4: the same answer
        [d + 3, EOS, PAD, PAD, PAD],                # 3
        [FILL, FILL, FILL, FILL, FILL],             # cut
        [d + 1, task.first_modulus, EOS, PAD, PAD],  # malformed
        [EOS, PAD, PAD, PAD, PAD],                  # no digit
    ])
    keys = task.vote_key(None, torch.full((6,), 4), responses)
    assert keys.tolist() == ["0", "0", "3", "~.....", "~1?$", "~$"]


# --- settings and the league's equal-generation entries ----------------------------------------------------------

def test_the_temperature_and_the_answer_key_are_checked_before_training(hydra_ctx):
    from recipe_apo.testbed.runner import check_method

    check_method(_compose(["method=agpo_dual", "algorithm.agpo_dual.base_temperature=0.8"]))  # follows the preset
    with pytest.raises(TestbedSettingError, match=r"rollout.temperature=0.7: must be 1.0: the testbed samples"):
        check_method(_compose(["method=grpo", "actor_rollout_ref.rollout.temperature=0.7"]))
    with pytest.raises(TestbedSettingError, match=r"rollout.temperature=0.7 with "
                                                  r"algorithm.agpo_dual.base_temperature=1.0: "
                                                  "method=agpo_dual needs them equal"):
        check_method(_compose(["method=agpo_dual", "actor_rollout_ref.rollout.temperature=0.7"]))
    with pytest.raises(TestbedSettingError, match=r"algorithm.agpo_dual.vote_key=string:capwords: must be null in the "
                                                  "testbed"):
        check_method(_compose(["method=agpo_dual", "algorithm.agpo_dual.vote_key=string:capwords"]))
    with pytest.raises(TestbedSettingError, match=r"kl_loss_type=k9: not a KL estimator verl computes"):
        check_method(_compose(["method=agpo_dual", "actor_rollout_ref.actor.kl_loss_type=k9"]))
    with pytest.raises(ValueError, match=r"algorithm.agpo_dual.clip_min"):
        check_method(_compose(["method=agpo_dual", "algorithm.agpo_dual.clip_min=0.5"]))


def test_the_2n_entries_double_the_scenarios_group_and_agpo_probes_with_it(hydra_ctx):
    from recipe_apo.testbed.configs import league_entries
    from recipe_apo.testbed.runner import checked_configs
    from recipe_apo.testbed.train import MethodRun, group_size, prepare_seed

    entries = league_entries(_compose(["mode=league"]))
    assert entries["grpo_2n"] == ["method=grpo", "rollout_n_multiplier=2"]
    assert entries["drgrpo_2n"] == ["method=drgrpo", "rollout_n_multiplier=2"]
    assert entries["apo_2n"] == ["method=apo", "rollout_n_multiplier=2"]
    chosen = {label: entries[label] for label in ("grpo", "grpo_2n", "agpo_dual")}
    # A scenario that sets rollout.n: the doubling and the probe follow it.
    cfgs = checked_configs([*TINY_RUN, "seeds=[0]", "actor_rollout_ref.rollout.n=3"], chosen)
    assert [group_size(cfgs[label]) for label in chosen] == [3, 6, 3]
    assert cfgs["agpo_dual"].algorithm.agpo_dual.probe_samples == 3
    run = MethodRun(cfgs["grpo_2n"], prepare_seed(cfgs["grpo"], 0))
    assert (run.group, run.actor.rollout_n) == (6, 6)
    batch, _, _ = run.sample_round(1, run.setup.train_prompts[0], run.setup.train_k[0])
    assert batch["responses"].shape[0] == 6 * run.setup.train_prompts.shape[1]
