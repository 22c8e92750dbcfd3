"""The real-model study's report (recipe_apo/cpu/real_report.py): its figures, worked out by hand on a small study;
the markdown and the plot rendered from the JSON alone."""

import json
import math

import pytest

from recipe_apo.cpu import real_report

LEVELS = ["easy", "hard"]


def scores_file(path, table):
    path.write_text("".join(json.dumps({"benchmark": level, "index": index, "score": score, "scores": [score]}) + "\n"
                            for level, rows in table.items() for index, score in rows.items()))
    return path


# Base: easy problems 0, 1 score 0.5 and 0.0; hard problems 0, 1, 2 score 0.0, 0.25, 0.0.
BASE = {"easy": {0: 0.5, 1: 0.0}, "hard": {0: 0.0, 1: 0.25, 2: 0.0}}
# Two methods x two seeds, each a small shift of the base.
RUNS = {
    ("grpo", 1): {"easy": {0: 0.5, 1: 0.5}, "hard": {0: 0.0, 1: 0.25, 2: 0.25}},
    ("grpo", 2): {"easy": {0: 1.0, 1: 0.0}, "hard": {0: 0.0, 1: 0.5, 2: 0.0}},
    ("apo", 1): {"easy": {0: 1.0, 1: 0.5}, "hard": {0: 0.25, 1: 0.5, 2: 0.25}},
    ("apo", 2): {"easy": {0: 1.0, 1: 1.0}, "hard": {0: 0.0, 1: 0.5, 2: 0.5}},
}


@pytest.fixture()
def study(tmp_path):
    base = scores_file(tmp_path / "base.jsonl", BASE)
    trained = {key: scores_file(tmp_path / f"{key[0]}{key[1]}.jsonl", table) for key, table in RUNS.items()}
    metrics = {("apo", 1): [{"step": 0, "val-core/easy/acc/mean@2": 0.25, "val-core/hard/acc/mean@2": 0.1},
                            {"step": 1, "training/global_step": 1, "critic/score/mean": 0.3, "timing_s/step": 40.0},
                            {"step": 2, "training/global_step": 2, "val-core/easy/acc/mean@2": 0.5,
                             "timing_s/step": 30.0}]}
    path = real_report.write(tmp_path / "results", base, trained, metrics, None, LEVELS, {"command": "x"},
                             {"steps": 2})
    return json.loads(path.with_suffix(".json").read_text()), path


def test_pass_at_1_and_the_paired_gain_over_the_base(study):
    data, _ = study
    derived = real_report.derive(data)
    apo1 = next(r for r in derived["runs"] if (r["method"], r["seed"]) == ("apo", 1))
    assert apo1["pass1"]["easy"] == pytest.approx(0.75)
    assert apo1["pass1"]["hard"] == pytest.approx(1.0 / 3)
    assert apo1["pass1"]["all"] == pytest.approx((1.0 + 0.5 + 0.25 + 0.5 + 0.25) / 5)
    # Differences by problem: easy 0.5, 0.5; hard 0.25, 0.25, 0.25: mean 0.35, sd sqrt(0.0375) over 4 degrees.
    gap = apo1["gap"]["all"]
    diffs = [0.5, 0.5, 0.25, 0.25, 0.25]
    sd = math.sqrt(sum((d - 0.35) ** 2 for d in diffs) / 4)
    assert gap["mean"] == pytest.approx(0.35) and gap["se"] == pytest.approx(sd / math.sqrt(5))
    assert gap["problems"] == 5 and gap["beyond_3se"] is True  # 0.35 > 3 * 0.0612
    grpo2 = next(r for r in derived["runs"] if (r["method"], r["seed"]) == ("grpo", 2))
    assert grpo2["gap"]["all"]["mean"] == pytest.approx((0.5 + 0.0 + 0.0 + 0.25 + 0.0) / 5)
    assert grpo2["gap"]["all"]["beyond_3se"] is False
    assert data["base"]["pass1"]["all"] == pytest.approx(0.75 / 5)


def test_a_method_against_another_is_paired_by_seed(study):
    data, _ = study
    pair = next(p for p in real_report.derive(data)["pairs"] if p["level"] == "all")
    assert (pair["a"], pair["b"]) == ("grpo", "apo")
    # Per seed, apo - grpo over all problems: seed 1 (2.5 - 1.5) / 5 = 0.2, seed 2 (3.0 - 1.5) / 5 = 0.3.
    assert pair["mean"] == pytest.approx(0.25)
    assert pair["se"] == pytest.approx(math.sqrt(0.005) / math.sqrt(2))
    assert pair["t"] == pytest.approx(0.25 / (math.sqrt(0.005) / math.sqrt(2)))
    assert pair["critical"] == 12.706 and pair["verdict"] == "within noise"  # t = 5.0 < 12.706 at one degree


def test_the_same_pair_paired_by_problem_pooled_over_seeds(study):
    data, _ = study
    pair = next(p for p in real_report.derive(data)["pairs"] if p["level"] == "all")
    # apo - grpo per problem, averaged over seeds 1 and 2: easy 0: (0.5 + 0) / 2, easy 1: (0 + 1) / 2, hard 0:
    # (0.25 + 0) / 2, hard 1: (0.25 + 0) / 2, hard 2: (0 + 0.5) / 2 -> 0.25, 0.5, 0.125, 0.125, 0.25: mean 0.25.
    per_problem = [0.25, 0.5, 0.125, 0.125, 0.25]
    sd = math.sqrt(sum((d - 0.25) ** 2 for d in per_problem) / 4)
    assert pair["problems"] == 5 and pair["problem_se"] == pytest.approx(sd / math.sqrt(5))
    assert pair["problem_t"] == pytest.approx(0.25 / (sd / math.sqrt(5)))  # 3.65 > 2.776 at 4 degrees
    assert pair["problem_critical"] == 2.776 and pair["verdict"] == "within noise"  # the seeds do not resolve it


@pytest.mark.parametrize("dof, table", [(11, 2.2010), (15, 2.1314), (20, 2.0860), (30, 2.0423), (60, 2.0003),
                                        (120, 1.9799)])
def test_the_critical_value_above_the_table_against_published_values(dof, table):
    assert real_report.t_critical(dof) == pytest.approx(table, abs=2e-4)


def test_seeds_that_agree_on_a_difference_the_problems_cannot_resolve_are_within_the_evaluations_noise():
    # a scores 0.5 on each of four problems; b's differences per seed are 0.10, 0.11, 0.12 over all problems (the
    # seed test's t = 19.05 > 4.303), from per-problem differences of +-0.5: averaged over seeds 0.5, -0.5, 0.5,
    # -0.06, whose SE over problems is 0.242 (t = 0.45 < 3.182).
    last = {1: 0.4, 2: 0.44, 3: 0.48}
    runs = [{"method": "grpo", "seed": s, "scores": {"x": {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}}} for s in last]
    runs += [{"method": "apo", "seed": s, "scores": {"x": {0: 1.0, 1: 0.0, 2: 1.0, 3: value}}}
             for s, value in last.items()]
    base = {"x": {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}}
    pair = next(p for p in real_report.derive({"levels": ["x"], "base": {"scores": base}, "runs": runs})["pairs"]
                if p["level"] == "x")
    assert pair["t"] == pytest.approx(0.11 / (0.01 / math.sqrt(3)))
    per_problem = [0.5, -0.5, 0.5, -0.06]
    sd = math.sqrt(sum((d - 0.11) ** 2 for d in per_problem) / 3)
    assert pair["problem_t"] == pytest.approx(0.11 / (sd / 2))
    assert pair["verdict"] == "within the evaluation's noise"


def test_verdicts_beyond_noise_and_without_spread():
    assert real_report.seed_test([0.1, 0.11, 0.12])["verdict"] == "beyond noise"  # t = 19.05 > 4.303
    assert real_report.seed_test([0.1, -0.1, 0.05])["verdict"] == "within noise"
    assert real_report.seed_test([0.2])["verdict"] == "one seed: no verdict"


def test_the_curve_and_the_steps_come_from_verls_logged_rows(study):
    data, _ = study
    apo1 = next(r for r in data["runs"] if (r["method"], r["seed"]) == ("apo", 1))
    assert apo1["curve"] == [{"step": 0, "easy": 0.25, "hard": 0.1}, {"step": 2, "easy": 0.5}]
    assert [row["step"] for row in apo1["training"]] == [1, 2]
    assert apo1["training"][0] == {"step": 1, "score": 0.3, "seconds": 40.0}


def test_the_report_renders_from_the_json_alone(study, tmp_path):
    data, md = study
    text = md.read_text()
    assert "| apo seed 1 | 75.0 | 33.3 | 50.0 | +35.0 +- 6.1 | yes |" in text
    assert "| apo - grpo | all | +25.0 | 5.0 | 5.00 | 12.706 | 6.8 | 3.65 | 2.776 | within noise |" in text
    assert (md.parent / "real_cpu.png").stat().st_size > 0
    again = tmp_path / "again" / "real_cpu.json"
    again.parent.mkdir()
    again.write_text(json.dumps(data))
    assert real_report.main([str(again)]) == 0
    assert again.with_suffix(".md").read_text() == text


def test_runs_scored_on_other_problems_than_the_base_are_refused(tmp_path):
    other = {"easy": {"easy/0": 1.0, "easy/7": 1.0}, "hard": {f"hard/{k}": v for k, v in BASE["hard"].items()}}
    base = {"scores": {level: {f"{level}/{k}": v for k, v in rows.items()} for level, rows in BASE.items()}}
    study = {"levels": LEVELS, "base": base, "runs": [{"method": "apo", "seed": 1, "scores": other}]}
    study = json.loads(json.dumps(study))  # the keys as the JSON file holds them
    with pytest.raises(ValueError, match="easy: the trained and base evaluations scored different problems"):
        real_report.derive(study)


def test_a_validation_dump_is_read_per_problem_whatever_its_order(tmp_path):
    import pandas as pd

    def rows(level, questions):
        return pd.DataFrame({"prompt": [[{"role": "system", "content": "s"}, {"role": "user", "content": q}]
                                        for q in questions],
                             "extra_info": [{"index": i} for i in range(len(questions))]})

    rows("easy", ["Calculate 1 + 2.", "Calculate 3 + 4."]).to_parquet(tmp_path / "easy.parquet")
    rows("hard", ["Calculate 10 - 20.", "Calculate 3 + 4."]).to_parquet(tmp_path / "hard.parquet")

    def line(question, score):
        return json.dumps({"input": f"system\ns\nuser\n{question}\nassistant\n", "output": "x", "score": score})

    dump = tmp_path / "0.jsonl"
    dump.write_text("\n".join([line("Calculate 3 + 4.", 1.0), line("Calculate 10 - 20.", 0.0),
                               line("Calculate 1 + 2.", 0.0), line("Calculate 3 + 4.", 0.0),
                               line("Calculate 1 + 2.", 0.0), line("Calculate 10 - 20.", 1.0)]) + "\n")
    table = real_report.read_validation(dump, tmp_path, LEVELS)
    # "Calculate 3 + 4." is in both files: its two samples (1, 0) are pooled, and it counts once over all levels.
    assert table == {"easy": {"Calculate 1 + 2.": 0.0, "Calculate 3 + 4.": 0.5},
                     "hard": {"Calculate 10 - 20.": 0.5, "Calculate 3 + 4.": 0.5}}
    assert real_report.pass_at_1(table, "all") == pytest.approx((0.0 + 0.5 + 0.5) / 3)
    dump.write_text(line("Calculate 5 + 5.", 1.0) + "\n")
    with pytest.raises(ValueError, match="0.jsonl:1: a question not in"):
        real_report.read_validation(dump, tmp_path, LEVELS)


def test_a_later_session_keeps_the_runs_of_a_report_with_the_same_settings(study, tmp_path):
    data, md = study
    path = md.with_suffix(".json")
    assert real_report.carried(path, {"steps": 2}) == data
    assert real_report.carried(path, {"steps": 3}) is None  # other settings: nothing is kept
    assert real_report.carried(tmp_path / "none.json", {"steps": 2}) is None
    # A new session trains apo seed 3 and re-trains nothing else: the report holds the four earlier runs and it.
    new = scores_file(tmp_path / "apo3.jsonl", RUNS[("apo", 1)])
    again = real_report.write(tmp_path / "later", data["base"]["scores"], {("apo", 3): new}, {}, None, LEVELS,
                              {"command": "y"}, {"steps": 2}, earlier=data)
    later = json.loads(again.with_suffix(".json").read_text())
    assert sorted((r["method"], r["seed"]) for r in later["runs"]) == [
        ("apo", 1), ("apo", 2), ("apo", 3), ("grpo", 1), ("grpo", 2)]
    assert {r["seed"]: r["provenance"]["command"] for r in later["runs"] if r["method"] == "apo"} == {
        1: "x", 2: "x", 3: "y"}
    assert later["base"] == data["base"]


def test_an_audit_beside_the_report_is_linked_relative_to_it_and_one_elsewhere_named_as_it_was(tmp_path):
    base = scores_file(tmp_path / "base.jsonl", BASE)
    trained = {("apo", 1): scores_file(tmp_path / "apo1.jsonl", RUNS[("apo", 1)])}
    results = tmp_path / "results"
    beside = real_report.write(results, base, trained, {}, results / "real_cpu_audit" / "report.md", LEVELS, {}, {})
    assert json.loads(beside.with_suffix(".json").read_text())["audit"] == "real_cpu_audit/report.md"
    text = beside.read_text()
    assert "[real_cpu_audit/report.md](real_cpu_audit/report.md)" in text
    assert "![the bias audit](real_cpu_audit/audit.png)" in text
    elsewhere = real_report.write(tmp_path / "other", base, trained, {}, tmp_path / "audit" / "report.md", LEVELS,
                                  {}, {})
    assert f"`{tmp_path / 'audit' / 'report.md'}`" in elsewhere.read_text()
