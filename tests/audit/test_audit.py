"""The bias audit on dumps built here, with every expected number worked out by hand (see each test's comments).

Step 1, G = 4, three groups (scores; lengths in tokens):
  g0 [1, 0, 0, 0]; [2, 4, 6, 8]     p_hat 1/4
  g1 [1, 1, 1, 1]; [3, 3, 3, 3]     dead (all right)
  g2 [1, 1, 0, 0]; [2, 2, 10, 10]   p_hat 1/2
Step 2, one group [0, 1, 0, 0]; [5, 5, 5, 5].

AGPO's replay has a step of its own (BONUS_STEP), with a group whose right answers differ in length.
"""

import json
import math

import numpy as np
import pytest

from recipe_apo.audit.analysis import audit_run
from recipe_apo.audit.dumps import AuditError, load_run
from recipe_apo.methods.group_stats import TOKEN_MEAN, TOKEN_SUM_NORM, token_weights, update_mass

EPS = 1e-6  # verl's grpo: (R - mean) / (std + eps), std unbiased
STEP1 = [([1, 0, 0, 0], [2, 4, 6, 8]), ([1, 1, 1, 1], [3, 3, 3, 3]), ([1, 1, 0, 0], [2, 2, 10, 10])]
STEP2 = [([0, 1, 0, 0], [5, 5, 5, 5])]
DR_GRPO_STEP1 = [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0, 0.5, 0.5, -0.5, -0.5]


def write_dump(folder, steps, with_recipe_fields=True, advantages=None):
    folder.mkdir(parents=True, exist_ok=True)
    for step, groups in steps.items():
        rows = []
        for g, (scores, lengths) in enumerate(groups):
            for r, (score, length) in enumerate(zip(scores, lengths)):
                row = {"input": f"prompt {g}", "output": "w " * length, "gts": "x", "score": float(score),
                       "step": step}
                if with_recipe_fields:
                    row.update(uid=f"s{step}g{g}_{r}_0", response_length=length, truncated=float(length >= 10),
                               data_source="toy")
                rows.append(row)
        if advantages is not None:
            for row, value in zip(rows, advantages[step]):
                row["advantage"] = value
        (folder / f"{step}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.fixture
def audited(tmp_path):
    write_dump(tmp_path / "exp" / "rollouts", {1: STEP1, 2: STEP2},
                        advantages={1: DR_GRPO_STEP1, 2: [-0.25, 0.75, -0.25, -0.25]})
    return audit_run(load_run(tmp_path / "exp"))


def test_dead_groups_and_their_tokens(audited):
    assert audited["name"] == "exp" and audited["length_unit"] == "tokens"
    first, second = audited["steps"]
    assert first["dead_share"] == pytest.approx(1 / 3)
    assert first["dead_token_share"] == pytest.approx(12 / 56)  # g1's 12 tokens of 20 + 12 + 24
    assert second["dead_share"] == 0.0
    dead = audited["dead"]
    assert dead["share"] == pytest.approx(1 / 4) and dead["all_right_share"] == pytest.approx(1 / 4)
    assert dead["all_wrong_share"] == 0.0 and dead["token_share"] == pytest.approx(12 / 76)


def test_signal_by_difficulty_for_each_method(audited):
    rows = {(row["G"], row["k"]): row for row in audited["difficulty"]}
    assert sorted(rows) == [(4, 1), (4, 2), (4, 4)]
    quarter, half = rows[(4, 1)], rows[(4, 2)]
    assert quarter["groups"] == 2 and half["groups"] == 1
    assert quarter["closed_form"] == pytest.approx(0.25 * 0.75 * 3) and half["closed_form"] == pytest.approx(0.75)
    # Dr. GRPO: centered rewards; one success in four gives +0.75 and three times -0.25.
    assert quarter["Dr. GRPO"] == pytest.approx({"positive": 0.75, "negative": 0.75})
    assert half["Dr. GRPO"] == pytest.approx({"positive": 1.0, "negative": 1.0})
    # GRPO: divided by the unbiased std, 0.5 for [1,0,0,0] and sqrt(1/3) for [1,1,0,0].
    assert quarter["GRPO"]["positive"] == pytest.approx(0.75 / (0.5 + EPS), rel=1e-6)
    assert half["GRPO"]["positive"] == pytest.approx(1.0 / (math.sqrt(1 / 3) + EPS), rel=1e-6)
    # APO, defaults (lambda 1.5, eta 1, eta_min 0.05). Step 1 warm-starts the anchor at y_1 = 7/12; g0's gap
    # is 1/4 - 7/12 = -1/3, so its positive advantage is raised by e^(1/3) and its negatives lowered by e^(-1/3).
    c1 = 7 / 12
    g0_pos, g0_neg = 0.75 * 1.5 * math.exp(1 / 3), 0.75 * 1.5 * math.exp(-1 / 3)
    assert half["APO"]["positive"] == pytest.approx(1.5 * math.exp(c1 - 0.5), rel=1e-6)
    assert half["APO"]["negative"] == pytest.approx(1.5 * math.exp(0.5 - c1), rel=1e-6)
    # Step 2: the history holds one value (std 0), so the rate is eta_min: C_2 = 0.95 C_1 + 0.05 y_2.
    c2 = 0.95 * c1 + 0.05 * 0.25
    step2_pos, step2_neg = 0.75 * 1.5 * math.exp(c2 - 0.25), 0.75 * 1.5 * math.exp(0.25 - c2)
    assert quarter["APO"]["positive"] == pytest.approx((g0_pos + step2_pos) / 2, rel=1e-6)
    assert quarter["APO"]["negative"] == pytest.approx((g0_neg + step2_neg) / 2, rel=1e-6)


def test_lengths_truncation_and_where_the_update_goes(audited):
    first = audited["steps"][0]
    assert first["length_correct"] == pytest.approx(18 / 7)  # 2, 3, 3, 3, 3, 2, 2
    assert first["length_incorrect"] == pytest.approx(38 / 5)  # 4, 6, 8, 10, 10
    assert first["truncated_share"] == pytest.approx(2 / 12)
    # Step 1's median length is 3: short = at most 3 tokens. Dr. GRPO's mass |A| x |o| (1/L0):
    # short correct 0.75*2 + 2*(0.5*2) = 3.5; long wrong 0.25*(4+6+8) + 2*(0.5*10) = 14.5; of 18.
    shares = first["methods"]["Dr. GRPO"]
    assert shares["short_correct"] == pytest.approx(3.5 / 18) and shares["long_wrong"] == pytest.approx(14.5 / 18)
    assert shares["long_correct"] == shares["short_wrong"] == 0.0
    # GRPO's mass is |A| whatever the length: short correct 1.5 + 2 x 0.866, long wrong 3 x 0.5 + 2 x 0.866.
    a, b = 0.75 / (0.5 + EPS), 0.5 / (math.sqrt(1 / 3) + EPS)
    grpo = first["methods"]["GRPO"]
    assert grpo["short_correct"] == pytest.approx((a + 2 * b) / (2 * a + 4 * b), rel=1e-6)
    assert grpo["long_wrong"] == pytest.approx((a + 2 * b) / (2 * a + 4 * b), rel=1e-6)


def test_scale_and_which_replay_the_logged_advantages_match(audited):
    assert audited["scale"]["GRPO"]["max"] == pytest.approx(0.75 / (0.5 + EPS), rel=1e-6)
    assert audited["scale"]["Dr. GRPO"]["max"] == pytest.approx(0.75)
    assert audited["logged"]["matches"] == ["Dr. GRPO"]
    assert audited["logged"]["max_abs_difference"]["Dr. GRPO"] < 1e-6
    assert audited["logged"]["max_abs_difference"]["GRPO"] > 0.5


def test_a_plain_verl_dump_groups_by_prompt_and_counts_characters_or_tokens(tmp_path):
    folder = write_dump(tmp_path / "plain", {1: STEP1}, with_recipe_fields=False)
    run = load_run(folder)
    assert run.length_source == "characters" and run.steps[0].truncated is None
    assert run.steps[0].lengths.tolist() == [2.0 * n for n in (2, 4, 6, 8, 3, 3, 3, 3, 2, 2, 10, 10)]  # "w " each
    result = audit_run(run)
    assert result["steps"][0]["dead_share"] == pytest.approx(1 / 3)  # groups from the prompt text

    def words(texts, add_special_tokens=False):  # a tokenizer's interface: one token per word
        return {"input_ids": [text.split() for text in texts]}

    tokens = load_run(folder, tokenizer=words, max_response_length=10)
    assert tokens.length_source == "tokenizer"
    assert tokens.steps[0].lengths.tolist() == [2, 4, 6, 8, 3, 3, 3, 3, 2, 2, 10, 10]
    assert tokens.steps[0].truncated.tolist() == [False] * 10 + [True, True]
    # The replays read the estimate too, at least 1: an output decoded without special tokens may be empty and
    # still have had its end token.
    assert tokens.steps[0].estimator_lengths.tolist() == tokens.steps[0].lengths.tolist()
    (folder / "1.jsonl").write_text((folder / "1.jsonl").read_text().replace('"output": "w w "', '"output": ""', 1))
    assert load_run(folder, tokenizer=words).steps[0].estimator_lengths.tolist()[:2] == [1, 4]


def test_unreadable_dumps_are_refused_naming_the_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AuditError, match="no <step>.jsonl files"):
        load_run(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "1.jsonl").write_text('{"output": "a", "score": 1.0}\nnot json\n')
    with pytest.raises(AuditError, match=r"1.jsonl:2: not JSON"):
        load_run(bad)
    (bad / "1.jsonl").write_text('{"output": "a", "score": NaN}\n')
    with pytest.raises(AuditError, match=r"1.jsonl:1: score NaN is not a finite number"):
        load_run(bad)


def test_the_command_compares_runs_side_by_side(tmp_path, capsys):
    # The command's main in this process (its process-level behaviour, one line and no traceback on bad input, is
    # tests/audit/test_untrusted_input.py's).
    from recipe_apo.audit.__main__ import main

    first = write_dump(tmp_path / "grpo-run" / "rollouts", {1: STEP1, 2: STEP2})
    second = write_dump(tmp_path / "apo-run" / "rollouts", {1: STEP2})
    out = tmp_path / "report"
    assert main([str(first.parent), str(second.parent), "--out", str(out), "--apo", "lambda_scale=2.0"]) == 0
    assert f"report: {out / 'report.md'}" in capsys.readouterr().out
    report = (out / "report.md").read_text()
    assert "| grpo-run | 25.0% | 0.0% | 25.0% | 15.8% |" in report  # dead groups: 1 of 4, 12 of 76 tokens
    assert "| apo-run | 0.0% | 0.0% | 0.0% | 0.0% |" in report
    assert "lambda_scale 2.0" in report and (out / "audit.png").stat().st_size > 10_000
    numbers = json.loads((out / "audit.json").read_text())
    assert [r["name"] for r in numbers] == ["grpo-run", "apo-run"]


def test_per_token_weights_follow_each_aggregation():
    lengths = np.array([1.0, 2.0, 4.0])
    assert token_weights(lengths, TOKEN_MEAN, l0=8).tolist() == [1.0, 0.5, 0.25]
    assert token_weights(lengths, TOKEN_SUM_NORM, l0=8).tolist() == [0.125] * 3
    assert update_mass([-2.0, 1.0, 1.0], lengths, TOKEN_MEAN, l0=8).tolist() == [2.0, 1.0, 1.0]
    assert update_mass([-2.0, 1.0, 1.0], lengths, TOKEN_SUM_NORM, l0=8).tolist() == [0.25, 0.25, 0.5]


def test_a_multi_output_trajectory_is_one_response_and_padding_rows_are_left_out(tmp_path):
    from recipe_apo.audit.dumps import read_step

    def row(uid, score, length, advantage):
        return {"input": "q", "output": f"o{uid}", "score": score, "step": 1, "uid": uid,
                "response_length": length, "advantage": advantage}

    rows = [row("g_0_0", 1.0, 3, 0.5), row("g_1_0", 0.0, 4, -0.5), row("g_0_1", 1.0, 5, 0.5),
            row("pad9f_0_0", 0.0, 0, 0.0), row("h_0_0", 1.0, 2, 0.0), row("h_1_0", 1.0, 6, 0.0)]
    path = tmp_path / "1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    step = read_step(path, 1)
    # g_0 (two outputs) is one response, its final output's, with both outputs' tokens; the padding row is gone.
    assert step.outputs == ["og_1_0", "og_0_1", "oh_0_0", "oh_1_0"]
    assert list(step.lines) == [2, 3, 5, 6] and list(step.groups) == ["g", "g", "h", "h"]
    np.testing.assert_array_equal(step.logged_lengths, [4, 8, 2, 6])
    # The estimator read the final output alone (the trainer hands it the final rows): g_0's is g_0_1's 5 tokens.
    np.testing.assert_array_equal(step.estimator_lengths, [4, 5, 2, 6])
    np.testing.assert_array_equal(step.scores, [0.0, 1.0, 1.0, 1.0])
    # A single-output step is read as it is.
    single = tmp_path / "2.jsonl"
    single.write_text("".join(json.dumps({**r, "step": 2}) + "\n" for r in rows if r["uid"] in ("h_0_0", "h_1_0")))
    assert read_step(single, 2).outputs == ["oh_0_0", "oh_1_0"]


def test_staleness_is_reported_by_lag_with_each_methods_update_mass(tmp_path):
    from recipe_apo.audit.report import report_markdown

    def row(uid, score, length, lag):
        return {"input": "q", "output": "o", "score": score, "step": 2, "uid": uid, "response_length": length,
                "policy_lag": lag}

    # Step 2 (step 1 trains version 0, the first: no lag yet), one group of four: two responses on-policy, two
    # one version old; a padding row without versions.
    rows = [row("g_0_0", 1.0, 2, 0), row("g_1_0", 0.0, 2, 0), row("g_2_0", 1.0, 6, 1), row("g_3_0", 0.0, 6, 1),
            {**row("pad1_0_0", 0.0, 0, None)}]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = audit_run(load_run(run_dir))
    assert result["staleness"]["response_share"] == {0: 0.5, 1: 0.5}
    # Dr. GRPO: |A_i| = 0.5 for all four, mass |A| x |o_i| / L0: lag 0 has 2 x 2 tokens, lag 1 has 2 x 6 tokens.
    assert result["staleness"]["mass"]["Dr. GRPO"] == pytest.approx({0: 0.25, 1: 0.75})
    # GRPO divides by |o_i|: every response weighs |A_i| alone.
    assert result["staleness"]["mass"]["GRPO"] == pytest.approx({0: 0.5, 1: 0.5})
    assert "## 5. Staleness" in report_markdown([result])
    # A null lag on a response that is not padding is refused, naming its line.
    rows[0]["policy_lag"] = None
    (run_dir / "2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(AuditError, match=r"2.jsonl:1: policy_lag null on a response that is not verl's padding row"):
        load_run(run_dir)


# ---- AGPO's replay: each response as long as it was -------------------------------------------------------------

# One step, G = 4 (scores; lengths in tokens):
#   b0 [1, 1, 1, 0]; [2, 4, 6, 8]   three right answers of three lengths: the length bonus acts
#   b1 [1, 0, 0, 0]; [3, 5, 7, 9]   one right answer: no spread, no bonus
BONUS_STEP = [([1, 1, 1, 0], [2, 4, 6, 8]), ([1, 0, 0, 0], [3, 5, 7, 9])]
BONUS_SCORES = [1, 1, 1, 0, 1, 0, 0, 0]
BONUS_LENGTHS = [2, 4, 6, 8, 3, 5, 7, 9]
BONUS_GROUPS = ["b0"] * 4 + ["b1"] * 4


def preset_wrong_reward() -> float:
    """The AGPO preset's ``algorithm.agpo.wrong_reward``, the reward of a wrong answer on its training scale (0
    where the setting does not exist: the rewards as scored)."""
    from recipe_apo.integration import presets

    return presets.compose("agpo").algorithm.agpo.get("wrong_reward", 0)


def agpo_by_hand(wrong: float) -> list[float]:
    """AGPO's advantages on BONUS_STEP at the preset's bonus b = 0.1, by hand, for a wrong answer's reward 0 or -1.

    b0's right answers: L_min 2 and L_max 6, so 1 + 0.1 (1 - (L - 2) / 4) = 1.1, 1.05 and 1.0; its wrong one w.
    Both groups then (R~ - mean) / (std + 1e-6), std unbiased (n - 1 = 3)."""
    if wrong == 0:
        # b0: R~ 1.1, 1.05, 1.0, 0: mean 3.15 / 4 = 0.7875; deviations 0.3125, 0.2625, 0.2125, -0.7875, whose
        # squares sum to 0.09765625 + 0.06890625 + 0.04515625 + 0.62015625 = 0.831875.
        b0, b0_std = [0.3125, 0.2625, 0.2125, -0.7875], math.sqrt(0.831875 / 3)
        # b1: 1, 0, 0, 0: mean 0.25; deviations 0.75, -0.25 x 3; squares 0.5625 + 3 x 0.0625 = 0.75.
        b1, b1_std = [0.75, -0.25, -0.25, -0.25], math.sqrt(0.75 / 3)
    else:
        # b0: R~ 1.1, 1.05, 1.0, -1: mean 2.15 / 4 = 0.5375; deviations 0.5625, 0.5125, 0.4625, -1.5375, whose
        # squares sum to 0.31640625 + 0.26265625 + 0.21390625 + 2.36390625 = 3.156875.
        b0, b0_std = [0.5625, 0.5125, 0.4625, -1.5375], math.sqrt(3.156875 / 3)
        # b1: 1, -1, -1, -1: mean -0.5; deviations 1.5, -0.5 x 3; squares 2.25 + 3 x 0.25 = 3.
        b1, b1_std = [1.5, -0.5, -0.5, -0.5], math.sqrt(3 / 3)
    return [d / (b0_std + EPS) for d in b0] + [d / (b1_std + EPS) for d in b1]


def test_agpos_replay_reads_each_responses_length_and_gives_its_length_bonus(tmp_path):
    from recipe_apo.integration.replay import method_advantages, method_named

    expected = agpo_by_hand(preset_wrong_reward())
    agpo = method_named("AGPO")
    replayed = method_advantages(BONUS_SCORES, BONUS_GROUPS, agpo, lengths=BONUS_LENGTHS)
    assert replayed.tolist() == pytest.approx(expected, rel=1e-6)
    # The replay as it was, every response one token long: b0's right answers have no spread and no bonus, and
    # b0 is GRPO's (1, 1, 1, w): deviations 0.25 x 3 and -0.75 over std 0.5 for w = 0, 0.5 x 3 and -1.5 over std
    # 1 for w = -1; each right answer 0.5, where the bonus gives the shortest 0.593 (w = 0) or 0.548 (w = -1).
    one_token = method_advantages(BONUS_SCORES, BONUS_GROUPS, agpo, lengths=[1] * 8)
    assert one_token[:3].tolist() == pytest.approx([0.5] * 3, rel=1e-5)
    assert np.abs(one_token - expected).max() > 0.04

    # Through the audit: the dump's response_length reaches the replay, which reproduces the run's advantages.
    write_dump(tmp_path / "agpo-run", {1: BONUS_STEP}, advantages={1: expected})
    logged = audit_run(load_run(tmp_path / "agpo-run"))["logged"]
    assert "AGPO" in logged["matches"] and logged["max_abs_difference"]["AGPO"] < 1e-6
    assert logged["max_abs_difference"]["GRPO"] > 0.04  # GRPO has no bonus


def test_the_replay_hands_each_estimator_the_settings_its_preset_declares(monkeypatch):
    from recipe_apo.integration import presets, replay

    compose = presets.compose

    def declaring(name, overrides=()):  # the AGPO preset as if its file declared a bonus of 0.3
        return compose(name, [*overrides, *(["algorithm.agpo.length_bonus=0.3"] if name == "agpo" else [])])

    monkeypatch.setattr(presets, "compose", declaring)
    (agpo,) = [method for method in replay.preset_methods() if method.name == "AGPO"]
    replayed = replay.method_advantages(BONUS_SCORES, BONUS_GROUPS, agpo, lengths=BONUS_LENGTHS)
    # b0's right answers: 1 + 0.3 (1 - (L - 2) / 4) = 1.3, 1.15, 1.0.
    if preset_wrong_reward() == 0:
        # R~ 1.3, 1.15, 1.0, 0: mean 3.45 / 4 = 0.8625; deviations 0.4375, 0.2875, 0.1375, -0.8625, whose squares
        # sum to 0.19140625 + 0.08265625 + 0.01890625 + 0.74390625 = 1.036875.
        deviations, std = [0.4375, 0.2875, 0.1375, -0.8625], math.sqrt(1.036875 / 3)
    else:
        # R~ 1.3, 1.15, 1.0, -1: mean 2.45 / 4 = 0.6125; deviations 0.6875, 0.5375, 0.3875, -1.6125, whose squares
        # sum to 0.47265625 + 0.28890625 + 0.15015625 + 2.60015625 = 3.511875.
        deviations, std = [0.6875, 0.5375, 0.3875, -1.6125], math.sqrt(3.511875 / 3)
    assert replayed[:4].tolist() == pytest.approx([d / (std + EPS) for d in deviations], rel=1e-6)
