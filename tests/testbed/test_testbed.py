"""The CPU testbed: seconds-long runs of every method, determinism, Proposition 1 against its closed form,
the config composition from the recipe's own presets, and sweep collection."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from helpers.paths import ROOT
from helpers.testbed_tiny import TINY_RUN
from hydra import initialize_config_module
from omegaconf import OmegaConf

from recipe_apo.integration import presets
from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.codapo.estimator import CodapoSettings

# A run of seconds: few rounds, a small batch, a short warm-up, one process; two seeds.
TINY = ["seeds=[0,1]", *TINY_RUN]


@pytest.fixture(scope="module")
def hydra_ctx():
    import recipe_apo.testbed.configs  # noqa: F401  (stores testbed.yaml's `testbed_settings`, the declared defaults)

    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        yield


def _run(overrides, out_dir):
    from recipe_apo.testbed.runner import run_testbed

    return run_testbed(overrides, out_dir, show_progress=False)


def _finite(value) -> bool:
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


@pytest.fixture(scope="module")
def tiny_run(hydra_ctx, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    return out, _run(TINY, out)


def test_smoke_every_method_writes_its_files_with_finite_numbers(tiny_run):
    out, summary = tiny_run
    for name in ("summary.json", "report.md", "success.png", "length.png", "metrics.png", "grad_norm.png"):
        assert (out / name).stat().st_size > 0, name
    assert list(summary["methods"]) == list(presets.names())  # every preset (the list: tests/test_catalog.py)
    on_disk = json.loads((out / "summary.json").read_text())
    for label in presets.names():
        for seed in ("0", "1"):
            run = on_disk["runs"][label][seed]
            # len_correct may be NaN in a round without a correct response; everything headline is finite.
            for key in ("success_avg", "success_final", "hard_success_avg", "len_incorrect", "cut_share",
                        "grad_norm_mean", "grad_norm_max", "wall_s"):
                assert math.isfinite(run[key]), (label, seed, key)
    assert on_disk["methods"]["grpo"]["loss_agg_mode"] == "seq-mean-token-mean"
    assert on_disk["methods"]["drgrpo"]["loss_scale_factor"] == on_disk["config"]["data"]["max_response_length"]
    assert on_disk["methods"]["apo"]["loss_mode"] == "apo"
    assert (on_disk["methods"]["codapo"]["adv_estimator"], on_disk["methods"]["codapo"]["loss_agg_mode"]) == (
        "codapo", "token-mean")
    assert on_disk["methods"]["codapo"]["active"] == {"codapo": dataclasses.asdict(CodapoSettings())}
    assert on_disk["methods"]["agpo_dual"]["loss_mode"] == "agpo_clip"
    assert on_disk["methods"]["agpo_dual"]["active"]["agpo_dual"]["probe_samples"] == on_disk["config"][
        "actor_rollout_ref"]["rollout"]["n"]
    assert on_disk["methods"]["grpo"]["active"] == {}
    # AGPO: the authors' estimator and loss, verl's group filter (a round trains on groups with a signal only)
    assert (on_disk["methods"]["agpo"]["adv_estimator"], on_disk["methods"]["agpo"]["loss_mode"]) == ("agpo", "agpo")
    assert on_disk["runs"]["agpo"]["0"]["filter_groups/filled_share_avg"] > 0
    assert on_disk["runs"]["agpo"]["0"]["filter_groups/gen_batches_avg"] >= 1
    assert "filter_groups/gen_batches_avg" not in on_disk["runs"]["grpo"]["0"]
    assert {label: m["rollout_n"] for label, m in on_disk["methods"].items()} == dict.fromkeys(on_disk["methods"], 4)
    # The probe's tokens are counted in what AGPO generates, and only AGPO has them.
    agpo = on_disk["runs"]["agpo_dual"]["0"]
    assert 0 < agpo["probe_tokens_avg"] < agpo["tokens_generated_avg"]
    assert "probe_tokens_avg" not in on_disk["runs"]["grpo"]["0"]
    report = (out / "report.md").read_text()
    assert "Paired differences" in report and "seed noise" in report


def test_a_run_writes_exactly_the_files_a_league_rerun_clears(tiny_run):
    from recipe_apo.testbed.report.summary import RUN_FILES

    out, _ = tiny_run
    assert sorted(p.name for p in out.iterdir()) == sorted(RUN_FILES)  # league.clear_earlier_league's list


def test_methods_of_a_seed_share_their_start(tiny_run):
    out, summary = tiny_run
    history = json.loads((out / "history.json").read_text())
    for seed in (0, 1):
        starts = {json.dumps(r["evals"]["overall"][0]) for r in history if r["seed"] == seed}
        assert len(starts) == 1  # same weights, same evaluation prompts and sampling at round 0
    assert summary["seed_setup"]["0"]["init_weights_sha256"] != summary["seed_setup"]["1"]["init_weights_sha256"]


def test_initial_success_by_bucket_comes_from_fresh_samples(tiny_run):
    # The buckets are cut on the initial policy's success over some samples; reporting the buckets' success on
    # those same samples would show "hard" harder than it is. The report uses the round-0 evaluation instead.
    out, summary = tiny_run
    history = json.loads((out / "history.json").read_text())
    for seed in (0, 1):
        setup = summary["seed_setup"][str(seed)]
        for run in (r for r in history if r["seed"] == seed):
            assert setup["initial_success"] == run["evals"]["overall"][0]
            assert setup["initial_success_by_bucket"] == {b: run["evals"][b][0] for b in ("hard", "medium", "easy")}
        assert set(setup["bucketing_success_by_bucket"]) == {"hard", "medium", "easy"}
    assert "measured on fresh samples" in (out / "report.md").read_text()


def test_apo_run_records_its_anchor(tiny_run):
    out, _ = tiny_run
    history = json.loads((out / "history.json").read_text())
    apo = [r for r in history if r["label"] == "apo"]
    assert apo and all(len(r["history"]["apo/anchor"]) == 4 for r in apo)
    assert all(0.0 <= c <= 1.0 for r in apo for c in r["history"]["apo/anchor"])
    assert not any("apo/anchor" in r["history"] for r in history if r["label"] != "apo")


def test_the_share_of_rounds_with_the_anchors_rate_at_its_floor(tiny_run):
    """eta_t = clip(eta std(H), eta_min, 1): a round is at the floor when its rate is eta_min exactly. The first
    round is the warm start (rate 1, no anchor_init: no rate decision, NaN) and the second at the floor (H holds C_1
    alone); the summary's share counts the rounds after the first."""
    out, _ = tiny_run
    history = json.loads((out / "history.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    eta_min = summary["methods"]["apo"]["active"]["apo"]["eta_min"]
    for record in (r for r in history if r["label"] == "apo"):
        rates, at_floor = record["history"]["apo/anchor_rate"], record["history"]["apo/anchor_rate_at_floor"]
        assert math.isnan(at_floor[0]) and at_floor[1:] == [float(rate == eta_min) for rate in rates[1:]]
        assert (rates[0], at_floor[1]) == (1.0, 1.0)
        run = summary["runs"]["apo"][str(record["seed"])]
        assert run["apo/anchor_rate_at_floor_avg"] == pytest.approx(sum(at_floor[1:]) / (len(at_floor) - 1))
        assert run["apo/anchor_rate_avg"] == pytest.approx(sum(rates) / len(rates))


def test_same_seed_gives_identical_numbers(hydra_ctx, tmp_path, tiny_run):
    # Seed 1 again, alone: every method's numbers are those of seed 1 in the two-seed run (a seed's runs read
    # nothing of another seed's), for half the cost of both seeds again.
    _, first = tiny_run
    again = _run(["seeds=[1]", *TINY_RUN], tmp_path)

    def seed_runs(summary, seed):
        return {label: {key: value for key, value in runs[seed].items() if key != "wall_s"}
                for label, runs in summary["runs"].items()}

    assert list(again["runs"]) == list(first["runs"]) and all(list(runs) == ["1"] for runs in again["runs"].values())
    # Through JSON so that NaN (a round without a correct response has no correct length) equals NaN.
    assert json.dumps(seed_runs(again, "1"), sort_keys=True) == json.dumps(seed_runs(first, "1"), sort_keys=True)


def test_any_registered_estimator_and_loss_by_name(hydra_ctx, tmp_path):
    overrides = TINY[1:] + ["seeds=[0]", "rounds=2", "method=grpo", "algorithm.adv_estimator=rloo",
                            "actor_rollout_ref.actor.policy_loss.loss_mode=sapo"]
    summary = _run(overrides, tmp_path)
    (label,) = summary["methods"]
    assert summary["methods"][label]["adv_estimator"] == "rloo"
    assert summary["methods"][label]["loss_mode"] == "sapo"
    assert "rloo" in label and "sapo" in label
    assert _finite(summary["runs"][label]["0"]["success_final"])


def test_presets_come_from_the_method_group(hydra_ctx):
    from hydra import compose

    from recipe_apo.integration import presets
    from recipe_apo.testbed.configs import method_configs

    cfgs = method_configs(["seeds=[0]"])
    assert list(cfgs) == list(presets.names())  # every preset, in their order (tests/integration/test_presets.py)
    for label, cfg in cfgs.items():
        preset = OmegaConf.load(ROOT / "conf" / "method" / f"{label}.yaml")
        assert cfg.algorithm.adv_estimator == preset.algorithm.adv_estimator
        assert cfg.actor_rollout_ref.actor.loss_agg_mode == preset.actor_rollout_ref.actor.loss_agg_mode
        assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == preset.actor_rollout_ref.actor.policy_loss.loss_mode
    assert cfgs["apo"].actor_rollout_ref.actor.loss_scale_factor == cfgs["apo"].data.max_response_length
    # The testbed's algorithm.apo node mirrors the estimator's defaults in code.
    node = OmegaConf.to_container(compose(config_name="testbed").algorithm.apo)
    assert node == dataclasses.asdict(ApoSettings())
    # And its algorithm.codapo node CoDaPO's, from the recipe's conf/codapo/default.yaml.
    codapo = OmegaConf.to_container(compose(config_name="testbed").algorithm.codapo)
    assert codapo == dataclasses.asdict(CodapoSettings())
    assert compose(config_name="testbed").algorithm.zero_variance == "keep"


def test_actor_config_is_verls_and_carries_the_preset(hydra_ctx):
    from verl.workers.config import FSDPActorConfig

    from recipe_apo.testbed.configs import method_configs
    from recipe_apo.testbed.update import actor_config

    cfg = method_configs(["method=apo"])["apo"]
    actor = actor_config(cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n)
    assert isinstance(actor, FSDPActorConfig)
    assert (actor.tau_pos, actor.tau_neg, actor.loss_scale_factor) == (1.0, 1.5, cfg.data.max_response_length)
    assert actor.policy_loss.loss_mode == "apo" and actor.rollout_n == cfg.actor_rollout_ref.rollout.n


def test_task_verifier_ignores_fillers_and_scores_cut_responses_zero():
    from recipe_apo.testbed.task import EOS, FILL, FIRST_SYMBOL, PAD, ReverseTask

    task = ReverseTask(alphabet=4, min_len=1, max_len=3, max_response_length=6, filler_mean=1.0)
    a, b, c = FIRST_SYMBOL, FIRST_SYMBOL + 1, FIRST_SYMBOL + 2
    prompts = torch.tensor([[PAD, a, b, 1]] * 4)
    k = torch.tensor([2, 2, 2, 2])
    responses = torch.tensor([
        [b, a, EOS, PAD, PAD, PAD],       # right
        [FILL, b, FILL, a, EOS, PAD],     # right, with fillers
        [a, b, EOS, PAD, PAD, PAD],       # wrong order
        [b, a, FILL, FILL, FILL, FILL],   # right symbols but never ended: cut at L0
    ])
    scored = task.score(prompts, k, responses)
    assert scored["reward"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert scored["length"].tolist() == [3, 5, 3, 6]
    assert scored["cut"].tolist() == [False, False, False, True]
    assert scored["fillers"].tolist() == [0, 2, 0, 4]  # filler tokens before the end (all of a cut response's)
    demos, fits = task.demonstrations(prompts, k, torch.Generator().manual_seed(0))
    assert (task.score(prompts, k, demos)["reward"][fits] == 1.0).all()
    del c


def test_signal_matches_the_closed_form_within_sampling_error():
    from recipe_apo.testbed.signal import closed_form, max_z, measure

    apo = dataclasses.asdict(ApoSettings())
    result = measure(group_sizes=[4, 8], p_points=6, groups=1000, anchor=0.5, apo_node=apo, seed=0)
    for size, entry in result["by_G"].items():
        # The exact expectation of Dr. GRPO, from the estimator's own outputs, is the closed form.
        np.testing.assert_allclose(entry["Dr. GRPO"]["exact"], closed_form(np.asarray(result["p"]), int(size)),
                                   atol=1e-6)
    assert max_z(result, "Dr. GRPO", "closed_form_drgrpo") < 4.5
    for method in ("GRPO", "APO"):
        assert max_z(result, method, "exact") < 4.5
    # Proposition 1's point: at p = 0.2 APO's positive signal exceeds Dr. GRPO's (hard prompts boosted).
    i = 1
    assert result["p"][i] == pytest.approx(0.2)
    assert result["by_G"]["8"]["APO"]["exact"][i] > result["by_G"]["8"]["Dr. GRPO"]["exact"][i]


def test_collect_gathers_jobs_into_one_table(tiny_run, tmp_path):
    from recipe_apo.testbed.report.collect import collect

    out, _ = tiny_run
    for i, value in enumerate(("1.1", "2.0")):
        job = tmp_path / f"{i}_algorithm.apo.lambda_scale={value}"
        (job / ".hydra").mkdir(parents=True)
        (job / "summary.json").write_text((out / "summary.json").read_text())
        (job / ".hydra" / "overrides.yaml").write_text(f"- algorithm.apo.lambda_scale={value}\n")
    text = collect(tmp_path)
    rows = text.split("## Across jobs")[0].splitlines()
    for value in ("1.1", "2.0"):
        assert sum(row.startswith(f"| algorithm.apo.lambda_scale={value} |") for row in rows) == 7  # methods
    assert (tmp_path / "collected.md").exists() and len(json.loads((tmp_path / "collected.json").read_text())) == 14


def test_collect_orders_jobs_by_number_and_states_a_single_seeds_mean_alone(tiny_run, tmp_path):
    from recipe_apo.testbed.report.collect import collect
    from recipe_apo.testbed.report.markdown import mean_and_spread

    out, _ = tiny_run
    for number in (10, 2, 1):  # Hydra's job folders; as text "10" would sort before "2"
        job = tmp_path / str(number)
        (job / ".hydra").mkdir(parents=True)
        (job / "summary.json").write_text((out / "summary.json").read_text())
        (job / ".hydra" / "overrides.yaml").write_text(f"- rounds={number}\n")
    rows = [line for line in collect(tmp_path).splitlines() if line.startswith("| rounds=")]
    assert [row.split(" | ")[0] for row in rows[::7]] == ["| rounds=1", "| rounds=2", "| rounds=10"]  # 7 methods
    assert mean_and_spread("{:.3f}", 0.5, float("nan")) == "0.500 (one seed)"
    assert mean_and_spread("{:.3f}", 0.5, 0.01) == "0.500 +- 0.010"


def test_collect_pairs_each_method_across_jobs_when_they_share_their_starts(tiny_run, tmp_path):
    import copy

    from recipe_apo.testbed.report.collect import across_jobs

    _, summary = tiny_run
    better = copy.deepcopy(summary)
    for seed in ("0", "1"):
        better["runs"]["apo"][seed]["success_avg"] += 0.01 * (int(seed) + 1)
    other_start = copy.deepcopy(summary)
    other_start["seed_setup"]["1"]["init_weights_sha256"] = "different"
    lines = across_jobs([("tau_neg=1.5", summary), ("tau_neg=0.6", better), ("task.max_len=6", other_start)])
    apo = [line for line in lines if line.startswith("| apo | tau_neg=0.6 |")]
    assert apo == ["| apo | tau_neg=0.6 | +0.010 +0.020 | +0.015 | 2/2 | within seed noise |"]  # 2 seeds: too few
    assert "| grpo | tau_neg=0.6 | +0.000 +0.000 | +0.000 | 0/2 | within seed noise |" in lines
    assert "| apo | task.max_len=6 | - | - | - | not paired: the jobs start from different weights |" in lines


def test_the_method_table_shows_what_a_loss_with_its_own_aggregation_does(tiny_run):
    import copy

    from recipe_apo.testbed.report.markdown import report_markdown

    _, summary = tiny_run
    changed = copy.deepcopy(summary)
    changed["methods"]["drgrpo"]["loss_mode"] = "sapo"
    assert ("| drgrpo | `grpo` | False | `sapo` | `seq-mean-token-mean (the loss's own; seq-mean-token-sum-norm "
            "ignored)` | - |") in report_markdown(changed)
    # The recipe's methods a run activates, by their declared titles, in the summary's order.
    changed["methods"]["drgrpo"]["active"] = {"apo": {}, "zero_variance": None}
    assert "ignored)` | APO, zero-variance denominator | " in report_markdown(changed)


def test_settings_the_testbed_cannot_honour_are_refused(hydra_ctx):
    from hydra import compose

    from recipe_apo.testbed.update import actor_config

    cfg = compose(config_name="testbed", overrides=["actor_rollout_ref.actor.entropy_coeff=0.01"])
    with pytest.raises(ValueError, match="entropy_coeff=0.01: the testbed has no entropy bonus"):
        actor_config(cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n)


def test_a_method_may_not_change_what_the_methods_of_a_seed_share(hydra_ctx):
    from recipe_apo.testbed.configs import method_configs

    with pytest.raises(ValueError, match=r"methods.long sets rounds=99: every method of a seed shares"):
        method_configs(['+methods.long=["method=apo","rounds=99"]'])
    with pytest.raises(ValueError, match=r"methods.wide sets task.max_len=6"):
        method_configs(['+methods.wide=["method=apo","task.max_len=6"]'])
    assert "apo_eta" in method_configs(['+methods.apo_eta=["method=apo","algorithm.apo.eta=0.5"]'])


def test_t_critical_values_are_students_for_any_number_of_seeds():
    from recipe_apo.testbed.report.stats import t_critical, t_two_sided_p

    table = {1: 12.706, 2: 4.303, 5: 2.571, 10: 2.228, 11: 2.201, 20: 2.086, 30: 2.042, 120: 1.980}
    for df, value in table.items():
        assert t_critical(df) == pytest.approx(value, abs=5e-4)
    assert t_two_sided_p(2.188, 11) == pytest.approx(0.0511, abs=1e-4)  # 12 seeds: not significant


def test_a_paired_difference_needs_the_exact_critical_value_and_every_seed():
    from recipe_apo.testbed.report.stats import paired

    # Twelve seeds, all positive, t between the normal's 1.96 and Student's 2.201 for 11 degrees of freedom.
    def t_of(y):
        d = np.array([1.0] * 11 + [y])
        return d.mean() / (d.std(ddof=1) / np.sqrt(12))

    low, high = 1.0, 100.0  # t falls as the last seed grows
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_of(mid) > 2.1 else (low, mid)
    result = paired([1.0] * 11 + [low], [0.0] * 12)
    assert result["t"] == pytest.approx(2.1, abs=1e-6) and result["seeds_agree"] == 12
    assert result["beyond_seed_noise"] is False
    # A seed without a value is reported as missing and keeps the verdict at "within seed noise".
    # Without the rule this would be significant: t = 17.3 on 2 degrees of freedom.
    gap = paired([1.0, 1.1, 0.9, float("nan")], [0.0, 0.0, 0.0, 0.0])
    assert gap["t"] > 4.303  # Student's 5% critical value for 2 degrees of freedom
    assert (gap["seeds"], gap["seeds_missing"], gap["beyond_seed_noise"]) == (3, 1, False)


def test_verdicts_pair_methods_by_label_not_by_name_prefix():
    from recipe_apo.testbed.report.markdown import verdict_lines

    beyond = {"mean": -0.011, "beyond_seed_noise": True, "seeds_agree": 4, "seeds": 4, "seeds_missing": 0}
    summary = {"methods": {"apo": {"adv_estimator": "apo"}, "apo_clip": {"adv_estimator": "apo"}},
               "paired": {"apo - apo_clip": {"success_avg": beyond, "hard_success_avg": beyond}}}
    lines = verdict_lines(summary)
    assert "- apo trails apo_clip on mean success over training by 0.011 (4/4 seeds agree)." in lines
    assert "- apo_clip beats apo on mean success over training by 0.011 (4/4 seeds agree)." in lines
    assert not any("apo_clip trails apo" in line or "apo beats apo_clip" in line for line in lines)


# --- CoDaPO in the testbed ---------------------------------------------------------------------------------

def _codapo_rounds(overrides):
    """Every round's data of one codapo run (seed 0), through run_method's hook."""
    from hydra import compose

    from recipe_apo.testbed.train import prepare_seed, run_method

    cfg = compose(config_name="testbed", overrides=TINY + ["method=codapo"] + overrides)
    setup = prepare_seed(cfg, 0)
    rounds = []

    def hook(r, batch, old_log_prob, advantages):
        rounds.append({"batch": batch, "old_log_prob": old_log_prob, "advantages": advantages})

    run = run_method(cfg, "codapo", setup, on_round=hook)
    return cfg, setup, rounds, run


def test_codapo_selection_by_hand():
    from recipe_apo.methods.codapo.estimator import resample_order, select_prompts

    # 8 prompts with weights 0.1 0.9 0.5 0.9 0.3 0.1 0.7 0.2; the 0.75 quantile of the sorted weights
    # (0.1 0.1 0.2 0.3 0.5 0.7 0.9 0.9) is 0.7 + 0.25 * (0.9 - 0.7) = 0.75: prompts 1 and 3 are kept, and the
    # second step repeats each 4 times in place.
    weights = np.repeat([0.1, 0.9, 0.5, 0.9, 0.3, 0.1, 0.7, 0.2], 2)
    uids = np.repeat(np.array([f"p{i}" for i in range(8)], dtype=object), 2)
    kept = select_prompts(uids[::2], uids, weights, 0.75)
    assert kept.tolist() == [1, 3]
    assert resample_order(kept, 8, 4).tolist() == [1, 1, 1, 1, 3, 3, 3, 3]
    assert resample_order(kept, 10, 4).tolist() == [1, 1, 1, 1, 3, 3, 3, 3, 1, 1]


def test_codapo_run_resamples_the_kept_prompts_of_each_pairs_first_round(hydra_ctx):
    from recipe_apo.methods.codapo.estimator import compute_codapo_advantage

    cfg, setup, rounds, run = _codapo_rounds([])
    P, G = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    assert len(rounds) == 4 and run["history"]["codapo/resampled"] == [0.0, 1.0, 0.0, 1.0]
    for r, data in enumerate(rounds):
        batch = data["batch"]
        # The estimator got the old log-probs: its advantages are CoDaPO's on this round's data, recomputed.
        advantages, weights, _ = compute_codapo_advantage(
            batch["token_level_rewards"], batch["response_mask"], data["old_log_prob"], batch["uid"], True, 0.1)
        torch.testing.assert_close(data["advantages"], advantages, rtol=0, atol=0)
        prompts = batch["prompts"][::G]
        assert len(set(batch["uid"].tolist())) == P  # every copy is a group of its own
        if r % 2 == 0:
            # First round of a pair: the seed's prompt batch of this round (CoDaPO reads batches 0, 2, ...).
            assert torch.equal(prompts, setup.train_prompts[r]) and torch.equal(batch["k"][::G], setup.train_k[r])
            # The kept prompts, by hand: per-group weight >= its 0.75 quantile (linear interpolation).
            group_weight = weights[::G]
            kept = np.flatnonzero(group_weight >= np.quantile(group_weight, 0.75))
            assert run["history"]["codapo/kept_prompts"][r] == len(kept)
            expected = np.tile(np.repeat(kept, 4), P)[:P]
            nxt = rounds[r + 1]["batch"]
            assert torch.equal(nxt["prompts"][::G], prompts[torch.from_numpy(expected)])
            assert torch.equal(nxt["k"][::G], batch["k"][::G][torch.from_numpy(expected)])
            # Four copies in place: [a, a, a, a, b, b, b, b].
            assert torch.equal(nxt["prompts"][::G][0:4], prompts[int(kept[0])].expand(4, -1))
        else:
            assert math.isnan(run["history"]["codapo/kept_prompts"][r])


def test_the_testbed_pairs_rounds_as_the_trainer_pairs_steps(hydra_ctx):
    # Round r is the trainer's step r + 1: given the first round's prompts (a verl prompt batch) and weights, the
    # CoDaPO runtime in the trainer's hands builds the second round's prompts the testbed trained on, copy for copy.
    from verl.utils import tensordict_utils as tu

    from recipe_apo.integration import verl_access
    from recipe_apo.methods import catalog
    from recipe_apo.methods.codapo.estimator import compute_codapo_advantage

    cfg, setup, rounds, run = _codapo_rounds(["rounds=2"])
    P, G = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    first, second = rounds[0]["batch"], rounds[1]["batch"]
    _, weights, _ = compute_codapo_advantage(first["token_level_rewards"], first["response_mask"],
                                             rounds[0]["old_log_prob"], first["uid"], True, 0.1)
    codapo = catalog.method("codapo").build_runtime(cfg)
    codapo.begin_step(1)
    prompts = tu.get_tensordict({"prompts": first["prompts"][::G], "k": first["k"][::G],
                                 "uid": np.asarray(first["uid"][::G], dtype=object)})
    codapo.drew_prompts(1, verl_access.prompts_of(prompts), host=None)
    codapo.pairing.add_weights(first["uid"], weights)
    kept = codapo.end_step(1)["codapo/kept_prompts"]
    codapo.begin_step(2)
    trainer_batch = verl_access.prompt_batch(codapo.replace_prompts(2, P), 2)
    assert kept == run["history"]["codapo/kept_prompts"][0]
    assert torch.equal(trainer_batch["prompts"], second["prompts"][::G])
    assert torch.equal(trainer_batch["k"], second["k"][::G])


def test_codapo_without_resampling_reads_the_prompt_stream_like_the_others(hydra_ctx):
    cfg, setup, rounds, run = _codapo_rounds(["algorithm.codapo.resample=false"])
    G = cfg.actor_rollout_ref.rollout.n
    for r, data in enumerate(rounds):
        assert torch.equal(data["batch"]["prompts"][::G], setup.train_prompts[r])
    assert run["history"]["codapo/resampled"] == [0.0] * 4


# --- algorithm.zero_variance: exclude (what verl gets) against exact (the definition) -------------------------

class _TablePolicy(torch.nn.Module):
    """log pi = theta[row] - 1 per position, the prompt's first token naming the row: a loss whose gradient is
    the per-token loss weight."""

    def __init__(self, rows: int, width: int) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(rows, width))

    def log_probs(self, prompts, responses):
        return self.theta[prompts[:, 0]] - 1.0


def _hand_batch(lengths, rewards, advantages, width=4):
    n = len(lengths)
    mask = torch.zeros(n, width)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1.0
    tlr = torch.zeros(n, width)
    tlr[torch.arange(n), torch.tensor(lengths) - 1] = torch.tensor(rewards, dtype=torch.float32)
    uid = np.repeat(np.array([f"g{i}" for i in range(n // 2)], dtype=object), 2)
    batch = {"prompts": torch.arange(n).unsqueeze(1), "responses": torch.zeros(n, width, dtype=torch.int64),
             "response_mask": mask, "token_level_rewards": tlr, "uid": uid}
    return batch, torch.tensor(advantages, dtype=torch.float32).unsqueeze(1) * mask


def _update(hydra_ctx_overrides, batch, advantages, zero_variance):
    """One ppo_update on the hand batch at ratio 1 (old = current log-probs), learning rate 0, the zero-variance
    denominator's runtime driven as the testbed drives it; returns the update's metrics with the runtime's step
    metrics, the per-mini-batch trace and the last mini-batch's gradient."""
    from hydra import compose

    from recipe_apo.methods import catalog
    from recipe_apo.methods.base import StepBatch, Trajectories
    from recipe_apo.testbed.update import actor_config, ppo_update

    cfg = compose(config_name="testbed", overrides=["method=grpo", "actor_rollout_ref.rollout.n=2",
                                                    "actor_rollout_ref.actor.grad_clip=1e9",
                                                    f"algorithm.zero_variance={zero_variance}"] + hydra_ctx_overrides)
    actor = actor_config(cfg.actor_rollout_ref.actor, 2)
    policy = _TablePolicy(*batch["response_mask"].shape)
    old = policy.log_probs(batch["prompts"], batch["responses"]).detach()
    runtimes = [m.build_runtime(cfg) for m in catalog.active(cfg)]
    step = StepBatch(batch["uid"], batch["token_level_rewards"], batch["response_mask"],
                     Trajectories.single(len(batch["uid"])), advantages=advantages)
    for runtime in runtimes:
        runtime.begin_step(1)
        out = runtime.after_advantage(1, step)
        step.advantages = out.advantages if out.advantages is not None else step.advantages
    trace = []
    metrics = ppo_update(policy, torch.optim.SGD(policy.parameters(), lr=0.0), actor, batch, step.advantages, old,
                         torch.Generator().manual_seed(0), runtimes=runtimes, trace=trace)
    for runtime in runtimes:
        metrics.update(runtime.end_step(1))
    return metrics, trace, policy.theta.grad.clone()


# Group g0 live (rewards 1, 0; advantages 1, -0.5), g1 dead (1, 1); 2, 3, 1, 2 valid tokens; ratio 1, so each
# token's loss is -A. Exact: the live responses (tokens) only in the denominator.
#   seq-mean-token-mean:      -(1 - 0.5) / 2 = -0.25                    (keep: / 4 = -0.125)
#   token-mean:               -(1 * 2 - 0.5 * 3) / 5 = -0.1             (keep: / 8)
#   seq-mean-token-sum-norm:  -(1 * 2 - 0.5 * 3) / 2 / L0 (4) = -0.0625 (keep: / 4 / 4)
@pytest.mark.parametrize("agg, exact, keep", [
    ("seq-mean-token-mean", -0.25, -0.125),
    ("token-mean", -0.1, -0.5 / 8),
    ("seq-mean-token-sum-norm", -0.0625, -0.5 / 16),
])
def test_zero_variance_exclude_is_exact_with_one_mini_batch(hydra_ctx, agg, exact, keep):
    batch, advantages = _hand_batch([2, 3, 1, 2], [1.0, 0.0, 1.0, 1.0], [1.0, -0.5, 0.0, 0.0])
    overrides = ["actor_rollout_ref.actor.ppo_mini_batch_size=2", f"actor_rollout_ref.actor.loss_agg_mode={agg}",
                 f"actor_rollout_ref.actor.loss_scale_factor={4 if agg.endswith('norm') else 'null'}"]
    results = {mode: _update(overrides, batch, advantages, mode) for mode in ("keep", "exclude", "exact")}
    assert len(results["exact"][1]) == 1  # one mini-batch
    assert results["exact"][0]["pg_loss"] == pytest.approx(exact, abs=1e-6)
    assert results["exclude"][0]["pg_loss"] == pytest.approx(exact, abs=1e-6)
    assert results["keep"][0]["pg_loss"] == pytest.approx(keep, abs=1e-6)
    torch.testing.assert_close(results["exclude"][2], results["exact"][2], rtol=0, atol=1e-6)
    assert results["exclude"][1][0]["denominator_ratio"] == pytest.approx(1.0)
    assert results["exclude"][0]["zero_variance/ratio_dev_mean"] == pytest.approx(0.0, abs=1e-12)


# Live share per mini-batch (of 2 groups of 2) against the round's: the loss of exclude over that of exact.
#   1/2 and 1, round 3/4:             2/3, 4/3        (|r - 1|: mean 1/3, max 1/3)
#   1/2, 1, 1, round 5/6:             3/5, 6/5, 6/5   (|r - 1|: mean 4/15, max 2/5)
#   token-mean, token shares 5/8 and 6/6, round 11/14: 35/44, 14/11
@pytest.mark.parametrize("agg, lengths, rewards, ratios", [
    ("seq-mean-token-mean", [2, 3, 1, 2, 1, 1, 2, 2], [1, 0, 1, 1, 1, 0, 0, 1], [2 / 3, 4 / 3]),
    ("seq-mean-token-mean", [2, 3, 1, 2, 1, 1, 2, 2, 3, 3, 4, 1], [1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1],
     [3 / 5, 6 / 5, 6 / 5]),
    ("token-mean", [2, 3, 1, 2, 1, 1, 2, 2], [1, 0, 1, 1, 1, 0, 0, 1], [35 / 44, 14 / 11]),
])
def test_zero_variance_exclude_is_off_by_the_live_share_ratio_per_mini_batch(hydra_ctx, agg, lengths, rewards, ratios):
    n = len(lengths)
    # Live groups: advantages +a, -a/2 with a growing by group; the dead group g1: 0, 0.
    adv = [0.0] * n
    for g in range(n // 2):
        if rewards[2 * g] != rewards[2 * g + 1]:
            adv[2 * g], adv[2 * g + 1] = 1.0 + g, -(1.0 + g) / 2
    batch, advantages = _hand_batch(lengths, rewards, adv)
    overrides = ["actor_rollout_ref.actor.ppo_mini_batch_size=2", f"actor_rollout_ref.actor.loss_agg_mode={agg}"]
    exclude, exclude_trace, _ = _update(overrides, batch, advantages, "exclude")
    _, exact_trace, _ = _update(overrides, batch, advantages, "exact")
    assert [t["rows"] for t in exclude_trace] == [list(range(s, s + 4)) for s in range(0, n, 4)]
    assert [t["denominator_ratio"] for t in exclude_trace] == pytest.approx(ratios, abs=1e-12)
    # The recorded ratio is what the loss is off by: exclude's mini-batch loss over exact's.
    assert [a["loss"] / b["loss"] for a, b in zip(exclude_trace, exact_trace)] == pytest.approx(ratios, abs=1e-6)
    deviations = [abs(r - 1) for r in ratios]
    assert exclude["zero_variance/ratio_dev_mean"] == pytest.approx(sum(deviations) / len(deviations), abs=1e-12)
    assert exclude["zero_variance/ratio_dev_max"] == pytest.approx(max(deviations), abs=1e-12)


def test_zero_variance_in_a_testbed_run(hydra_ctx, tmp_path):
    # One mini-batch per round: exclude and exact make the same first update (later rounds may part by float
    # rounding); the recorded ratio is 1 and the round's scale B / B_live. Strings of up to 3 symbols: the tiny
    # run's pretraining leaves a round with live and dead groups (5 of 8 live; up to 8 symbols took 200 steps).
    dropped = ("seeds=", "rounds=", "actor_rollout_ref.actor.ppo_mini")
    one = [o for o in TINY if not o.startswith(dropped)]
    one += ["seeds=[0]", "rounds=1", "task.max_len=3", "method=grpo", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    from recipe_apo.testbed.runner import run_testbed

    entries = {mode: ["method=grpo", f"algorithm.zero_variance={mode}"] for mode in ("exclude", "exact", "keep")}
    run_testbed([o for o in one if o != "method=grpo"], tmp_path, show_progress=False, entries=entries)
    runs = {run["label"]: run["history"] for run in json.loads((tmp_path / "history.json").read_text())}
    assert runs["exclude"]["pg_loss"][0] == pytest.approx(runs["exact"]["pg_loss"][0], abs=1e-6)
    assert runs["exclude"]["grad_norm"][0] == pytest.approx(runs["exact"]["grad_norm"][0], rel=1e-5)
    assert runs["exclude"]["zero_variance/ratio_dev_max"] == [pytest.approx(0.0, abs=1e-12)]
    assert 0 < runs["exclude"]["live_share"][0] < 1  # a round with live and dead groups
    assert runs["exclude"]["zero_variance/scale"][0] == pytest.approx(1.0 / runs["exclude"]["live_share"][0])
    # keep divides by every response: its loss is the live share of exclude's.
    assert runs["keep"]["pg_loss"][0] == pytest.approx(runs["exclude"]["pg_loss"][0] * runs["keep"]["live_share"][0],
                                                       abs=1e-6)
    assert "zero_variance/ratio_dev_mean" not in runs["keep"]
    assert math.isnan(runs["exact"]["zero_variance/ratio_dev_mean"][0])  # declared, and not exclude's to have


def test_zero_variance_settings_are_checked_before_training(hydra_ctx, tmp_path):
    with pytest.raises(ValueError, match="algorithm.zero_variance=drop: one of keep, exclude, exact"):
        _run(TINY + ["method=grpo", "algorithm.zero_variance=drop"], tmp_path)
    with pytest.raises(ValueError, match="token-sum: that mode has no denominator"):
        _run(TINY + ["method=grpo", "algorithm.zero_variance=exact", "actor_rollout_ref.actor.loss_agg_mode=token-sum"],
             tmp_path)
    from recipe_apo.testbed.configs import method_configs

    assert list(method_configs(["method=grpo", "algorithm.zero_variance=exclude"])) == ["grpo[exclude]"]


@pytest.mark.fresh_process
def test_the_same_numbers_under_two_kernel_settings_of_the_machine(tmp_path):
    """python -m recipe_apo.testbed started with the pinned kernels, and as a machine of other kernels would start
    it (torch's scalar ones; the package's import sets the pinned ones before torch loads): the same figures.
    Without the pin the two differ in the last bits (grad norms at the 8th digit, measured here)."""
    import json
    import os
    import subprocess
    import sys

    from helpers.testbed_tiny import TINY_RUN

    from recipe_apo.testbed import kernels

    if not kernels.wanted(os.environ):
        pytest.skip("the pin is for x86-64 machines")
    figures, fingerprints = [], []
    for name, settings in (("pinned", kernels.PINNED), ("scalar", {"ATEN_CPU_CAPABILITY": "default"})):
        env = {**{k: v for k, v in os.environ.items() if k not in kernels.PINNED}, **settings}
        out = tmp_path / name
        result = subprocess.run([sys.executable, "-m", "recipe_apo.testbed", *TINY_RUN, "seeds=[0]", "method=apo",
                                 f"hydra.run.dir={out}"],
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["kernels"]["cpu_capability"] == "AVX2"
        assert summary["kernels"]["pinned"] == kernels.PINNED
        fingerprints.append(summary["kernels"]["fingerprint"])
        for run in summary["runs"].values():
            for seed_run in run.values():
                seed_run.pop("wall_s")
        figures.append(json.dumps(summary["runs"], sort_keys=True))  # NaN equals NaN through JSON
    assert figures[0] == figures[1]
    assert fingerprints[0] == fingerprints[1]
    assert sorted(fingerprints[0]) == ["adamw", "exp_log", "gru_backward", "gru_forward", "linear_log_softmax",
                                       "matmul", "sampling"]
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX2":  # this process runs torch's own wider kernels
        assert kernels.fingerprint() != fingerprints[0]


def test_the_testbed_start_is_told_from_the_interpreters_own_arguments(monkeypatch):
    import os

    from recipe_apo.testbed.kernels import PINNED, pin_early, started_as

    module = "recipe_apo.testbed"
    assert started_as(module, ["python", "-m", module, "seeds=[0]"])
    assert started_as(module, ["python", "-W", "ignore::UserWarning", "-X", "importtime", "-B", "-m", module])
    assert started_as(module, ["python", f"-m{module}"])
    assert not started_as(module, ["python", "-m", "recipe_apo.audit", module])  # an argument, not the module
    assert not started_as(module, ["python", "-c", "import recipe_apo", "-m", module])
    assert not started_as(module, ["python", "script.py", "-m", module])
    assert not started_as(module, ["python", "-W", "-m", module])  # -W's value
    assert not started_as(module, ["python", "-m"])
    # torch loaded already: the environment stays as it is (the testbed's re-execution does the pinning then)
    monkeypatch.setattr("sys.orig_argv", ["python", "-m", module])
    for key in PINNED:
        monkeypatch.delenv(key, raising=False)
    pin_early()
    assert not any(key in os.environ for key in PINNED)


# --- Stale responses -----------------------------------------------------------------------------------------

def test_a_stale_run_samples_and_takes_old_log_probs_from_the_policy_of_two_rounds_ago(hydra_ctx, monkeypatch):
    from hydra import compose

    import recipe_apo.testbed.train as train

    built = []
    build = train.build_policy
    monkeypatch.setattr(train, "build_policy", lambda *a, **k: built.append(build(*a, **k)) or built[-1])
    cfg = compose(config_name="testbed", overrides=TINY + ["method=apo", "scenario=stale"])
    assert cfg.staleness == 2 and cfg.scenario_name == "stale"
    setup = train.prepare_seed(cfg, 0)
    built.clear()  # the pretraining's policy
    states, rounds = [], []

    def hook(r, batch, old_log_prob, advantages):
        # Called before the round's update: the trained policy's weights after r updates.
        states.append({k: v.detach().clone() for k, v in built[0].state_dict().items()})
        rounds.append((batch, old_log_prob))

    run = train.run_method(cfg, "apo", setup, on_round=hook)
    assert len(built) == 2 and len(rounds) == cfg.rounds == 4
    reference = build(train.make_task(cfg), cfg.policy.embed_dim, cfg.policy.hidden_dim, cfg.policy.layers, 0)
    for r, (batch, old_log_prob) in enumerate(rounds):
        reference.load_state_dict(states[max(0, r - 2)])
        with torch.no_grad():
            assert torch.equal(old_log_prob, reference.log_probs(batch["prompts"], batch["responses"]))
    # The ratio starts at 1 where the lag has not built up (round 0), and away from it after updates.
    deviations = run["history"]["ratio_dev_mean"]
    assert deviations[0] == 0.0 and all(d > 0 for d in deviations[1:])
    assert "actor/apo_gate_weight" in run["history"] and all(0 <= s <= 1 for s in run["history"]["ratio_out_share"])

    # Round 0 of a stale run is the on-policy run's round 0: the same start, the same sampling stream.
    fresh = []
    on_policy = compose(config_name="testbed", overrides=TINY + ["method=apo"])
    train.run_method(on_policy, "apo", setup, on_round=lambda r, b, o, a: fresh.append((b, o)))
    assert torch.equal(fresh[0][0]["responses"], rounds[0][0]["responses"])
    assert torch.equal(fresh[0][1], rounds[0][1])


@pytest.mark.parametrize("value", [-1, 2.5, "two", True, 1001])
def test_staleness_is_checked_before_training(hydra_ctx, tmp_path, value):
    with pytest.raises(ValueError, match=r"staleness=.*: a whole number in \[0, 1000\]"):
        _run(TINY + ["method=grpo", f"staleness={value}"], tmp_path)


def test_the_report_shows_the_trust_region_metrics_and_a_dash_where_a_method_has_none(hydra_ctx, tmp_path):
    from recipe_apo.testbed.runner import run_testbed

    summary = run_testbed(["seeds=[0]", *TINY_RUN, "scenario=stale"], tmp_path, show_progress=False,
                          entries={"grpo": ["method=grpo"], "apo": ["method=apo"]})
    report = (tmp_path / "report.md").read_text()
    agg = summary["aggregate"]
    assert agg["apo"]["ratio_dev_mean"]["mean"] > 0 and agg["grpo"]["ratio_dev_mean"]["mean"] > 0
    gate_avg = "actor/apo_gate_weight_avg"  # the apo loss's declared metric, its mean over the rounds
    assert 0 < agg["apo"][gate_avg]["mean"] <= 1 and gate_avg not in agg["grpo"]
    gate = next(line for line in report.splitlines() if line.startswith("| actor/apo_gate_weight: "))
    assert gate.split("|")[2].strip() == "-"  # grpo is the first column
    assert "| share of tokens with r outside [0.8, 1.2] |" in report
    assert "Task: strings of up to 8 symbols, responses from the policy of 2 rounds before. 4 rounds" in report


def test_no_report_header_breaks_its_markdown_table():
    from recipe_apo.testbed.report.league import COLUMNS, own_columns, trust_columns
    from recipe_apo.testbed.report.markdown import HEADLINE, method_rows

    assert [h for _, h, _, _ in HEADLINE + method_rows() if "|" in h] == []
    # The league's columns, a method's own headed by its declared words (a "|" there once split report.md's rows).
    columns = COLUMNS + trust_columns() + [c for _, own in own_columns() for c in own]
    assert [h for _, h, _ in columns if "|" in h] == []
