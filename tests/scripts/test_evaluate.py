"""scripts/evaluate.py's CPU parts: the statistics (mean pass@1, its standard error, pass@k, runs pooled over seeds),
which samples per problem can give the paper's figures, the table and its comparison with the paper, scoring,
a training run's validation dump, and the merge and generation commands it would run.

Every number asserted here is worked out by hand in the comment beside it.
"""

import importlib.util
import json
import math
import os
import sys

import pandas as pd
import pytest
from helpers.paths import ROOT as REPO_ROOT

ROOT = str(REPO_ROOT)


def load_evaluate():
    spec = importlib.util.spec_from_file_location("evaluate_script", os.path.join(ROOT, "scripts", "evaluate.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


evaluate = load_evaluate()
COUNTS = {"aime24": 30, "amc": 83, "math500": 500, "minerva": 272, "olympiadbench": 675}


def write_scores(path, correct, samples=None):
    """A scores.jsonl with the paper's count of problems for each benchmark; ``correct[b]`` right samples in all,
    given to the first problems, ``samples[b]`` (default 1) per problem."""
    with open(path, "w") as handle:
        for benchmark, count in COUNTS.items():
            k = (samples or {}).get(benchmark, 1)
            right = correct[benchmark]
            for index in range(count):
                scores = [1.0 if index * k + j < right else 0.0 for j in range(k)]
                handle.write(json.dumps({"benchmark": benchmark, "index": index, "scores": scores,
                                         "score": sum(scores) / k}) + "\n")
    return str(path)


def error_line(capsys):
    """The one line argparse's parser.error writes after the usage."""
    return capsys.readouterr().err.strip().splitlines()[-1]


# ---- statistics ----------------------------------------------------------------------------------------------


def test_pass_at_k_is_the_unbiased_estimator():
    # 1 - C(n-c, k) / C(n, k)
    assert evaluate.pass_at_k(4, 1, 2) == 0.5  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert evaluate.pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert evaluate.pass_at_k(4, 1, 4) == 1.0 and evaluate.pass_at_k(4, 0, 2) == 0.0
    assert evaluate.pass_at_k(1, 1, 1) == 1.0  # greedy: pass@1 is the score
    with pytest.raises(ValueError, match="pass@3 needs at least 3 samples per problem, got 2"):
        evaluate.pass_at_k(2, 1, 3)


def test_mean_pass_at_1_its_standard_error_and_pass_at_k_over_three_problems():
    rows = [{"benchmark": "aime24", "scores": [1.0, 1.0, 1.0, 1.0], "score": 1.0},
            {"benchmark": "aime24", "scores": [1.0, 0.0, 0.0, 0.0], "score": 0.25},
            {"benchmark": "aime24", "scores": [0.0, 0.0, 0.0, 0.0], "score": 0.0}]
    (name, result), = evaluate.summarize(rows).items()
    assert name == "aime24" and (result.problems, result.samples) == (3, 4)
    # fractions 100, 25, 0: mean 125/3; deviations 175/3, -50/3, -125/3, squares summing to 48750/9;
    # variance (ddof 1) 48750/18; SE = sqrt(48750/18 / 3) = sqrt(902.78) = 30.046
    assert result.mean == pytest.approx(125 / 3)
    assert result.se == pytest.approx(math.sqrt(48750 / 54)) and round(result.se, 3) == 30.046
    # pass@4: 1, 1 (one right of 4 is in any draw of all 4), 0 -> 2/3
    assert result.pass_at_k == pytest.approx(200 / 3)


def test_pass_at_k_takes_the_fewest_samples_and_old_files_count_one_sample():
    rows = [{"benchmark": "amc", "scores": [1.0, 0.0, 0.0, 0.0], "score": 0.25},
            {"benchmark": "amc", "scores": [0.0, 1.0], "score": 0.5}]
    result = evaluate.estimate(rows)
    # k = 2: pass@2 of 1 right in 4 is 1 - C(3,2)/C(4,2) = 0.5, of 1 right in 2 is 1 -> 75
    assert result.samples == 2 and result.pass_at_k == pytest.approx(75.0)
    # mean (25 + 50) / 2 = 37.5; SE = |50 - 25| / 2 = 12.5 (two values: std ddof 1 = 17.68, / sqrt 2)
    assert result.mean == pytest.approx(37.5) and result.se == pytest.approx(12.5)
    # A greedy file without per-sample scores: each problem one sample; pass@1 = mean
    greedy = evaluate.estimate([{"score": 1.0}, {"score": 0.0}, {"score": 0.0}, {"score": 1.0}])
    # fractions 100, 0, 0, 100: mean 50, std (ddof 1) sqrt(4 * 2500 / 3) = 57.735, SE = 57.735 / 2 = 28.868
    assert (greedy.mean, greedy.samples, greedy.pass_at_k) == (50.0, 1, 50.0)
    assert round(greedy.se, 3) == 28.868
    assert evaluate.estimate([{"score": 1.0}]).se is None  # one problem: no SE


def test_the_average_and_runs_pooled_over_seeds():
    E = evaluate.Estimate
    cells = [E(10, 3), E(20, 4), E(30, 0), E(40, 0), E(50, 0)]
    # (10 + 20 + 30 + 40 + 50) / 5 = 30; SE sqrt(3^2 + 4^2) / 5 = 5 / 5 = 1
    assert evaluate.average(cells) == E(30, 1.0)
    assert evaluate.average(cells[:4] + [None]) is None
    # three seeds at 40, 44, 42: mean 42; std (ddof 1) sqrt((4 + 4 + 0) / 2) = 2; SE 2 / sqrt(3) = 1.155
    pooled = evaluate.across_runs([E(40, 5, 30, 32, 70.0), E(44, 5, 30, 32, 80.0), E(42, 5, 30, 32, 75.0)])
    assert (pooled.mean, pooled.runs, pooled.samples, pooled.pass_at_k) == (42, 3, 32, 75.0)
    assert pooled.se == pytest.approx(2 / math.sqrt(3))


def test_the_sampling_se_by_hand():
    """Two problems of 4 samples: 3 right (p = 0.75, s^2 = 4 x 0.75 x 0.25 / 3 = 0.25, s^2 / k = 0.0625) and 1 right
    (the same): SE = 100 sqrt(0.125) / 2 = 17.68. A problem solved by every sample adds no sampling noise; a
    single sample per problem (greedy) gives none."""
    assert evaluate.sampling_se([[1, 1, 1, 0], [0, 1, 0, 0]]) == pytest.approx(100 * math.sqrt(0.125) / 2)
    assert evaluate.sampling_se([[1, 1, 1, 1], [0, 1, 0, 0]]) == pytest.approx(100 * math.sqrt(0.0625) / 2)
    assert evaluate.sampling_se([[1], [0]]) is None
    rows = [{"score": 0.75, "scores": [1, 1, 1, 0]}, {"score": 0.25, "scores": [0, 1, 0, 0]}]
    result = evaluate.estimate(rows)
    # the between-problem SE holds how the two problems differ (50 points apart): 25.0; the sampling SE 17.7
    assert result.se == pytest.approx(25.0) and result.sampling_se == pytest.approx(17.678, abs=1e-3)
    both = evaluate.average([result, result])
    assert both.sampling_se == pytest.approx(math.sqrt(2) * result.sampling_se / 2)


def test_a_gap_is_beyond_noise_only_across_seeds():
    E = evaluate.Estimate
    # one run: no verdict, the gap beside the evaluation's sampling SE (seed noise is not measured)
    assert evaluate.gap_cell(E(30.0, 2.0, sampling_se=1.1), 25.4) == "+4.6 (one run; sampling SE 1.1)"
    assert evaluate.gap_cell(E(30.0, 2.0), 25.4) == "+4.6 (one run, one sample per problem: no SE)"
    # three seeds: Student's t with 2 degrees of freedom, 4.303 x 1.155 = 4.97; 1.96 SE (2.26) would call it
    assert evaluate.gap_cell(E(42.0, 2 / math.sqrt(3), runs=3), 45.5) == "-3.5 within noise"
    assert evaluate.gap_cell(E(42.0, 2 / math.sqrt(3), runs=3), 47.0) == "-5.0 beyond noise"
    assert evaluate.gap_cell(None, 45.5) == "-"
    assert evaluate.critical_value(1) == 1.96 and evaluate.critical_value(3) == 4.303
    assert evaluate.critical_value(31) == 2.042 and evaluate.critical_value(100) == 1.96


# ---- which samples per problem can give the paper's figures --------------------------------------------------


def test_attainable_figures_by_hand():
    # AIME24 greedy: 6/30 = 20.0, 7/30 = 23.3: the paper's 23.0 is not a value it takes, 23.3 is
    assert not evaluate.attainable(23.0, 30, 1) and evaluate.attainable(23.3, 30, 1)
    # 23 samples each: 159/690 = 23.04 prints 23.0; 175/690 = 25.36 prints 25.4
    assert evaluate.attainable(23.0, 30, 23) and evaluate.attainable(25.4, 30, 23)
    # 30 samples each: 409/900 = 45.44, 410/900 = 45.56: neither prints 45.5
    assert not evaluate.attainable(45.5, 30, 30)
    # Minerva greedy: 85/272 = 31.25 exactly, 31.3 when halves round up: counted (either rounding)
    assert evaluate.attainable(31.3, 272, 1) and not evaluate.attainable(35.1, 272, 1)  # 95/272 = 34.93, 96: 35.29
    assert evaluate.attainable(0.0, 30, 1) and evaluate.attainable(100.0, 30, 1)
    assert evaluate.every_figure_from(30) == 34 and evaluate.every_figure_from(500) == 2  # N k >= 1,000


def test_every_paper_figure_is_attainable_at_the_default_samples_and_not_greedily():
    for key, _, problems in evaluate.BENCHMARKS:
        figures = evaluate.paper_figures(key)
        assert len(figures) == 6
        assert all(evaluate.attainable(f, problems, evaluate.DEFAULT_SAMPLES[key]) for f in figures), key
        assert not all(evaluate.attainable(f, problems, 1) for f in figures), key  # greedy cannot give them all
    assert evaluate.attaining_samples("aime24", 30) == [23, 28, 29, 31, 32, 33, 34]
    assert evaluate.attaining_samples("minerva", 272) == [2, 4]
    assert evaluate.attaining_samples("amc", 83) == [11, 12, 13]


def test_the_attainability_table_is_the_one_in_docs(capsys):
    assert evaluate.main(["--attainability"]) == 0
    printed = capsys.readouterr().out.strip()
    lines = printed.splitlines()
    assert lines[2] == "| AIME24 | 30 | 23.0, 25.4, 40.1, 45.5 | 23, 28, 29, 31 and up | 32 | 960 |"
    assert lines[5] == "| Minerva | 272 | 35.1 | 2, 4 and up | 4 | 1,088 |"
    assert lines[-1] == "| all five | 1,560 | | 23, 28, 29, 31 and up (one k for all) | | 8,076 |"
    with open(os.path.join(ROOT, "docs", "paper.md"), encoding="utf-8") as handle:
        assert printed in handle.read()


# ---- the table -----------------------------------------------------------------------------------------------


def test_table_from_scored_results_is_laid_out_like_the_paper(tmp_path):
    # 7/30, 41/83, 376/500, 70/272, 263/675 -> 23.3, 49.4, 75.2, 25.7, 39.0: the paper's 1.5B GRPO row. SE of
    # N problems with a fraction p right (in percent): 100 sqrt(p (1 - p) N / (N - 1)) / sqrt(N): 7.85, 5.52,
    # 1.93, 2.66, 1.88; of the average sqrt(7.85^2 + 5.52^2 + 1.93^2 + 2.66^2 + 1.88^2) / 5 = 10.32 / 5 = 2.06
    path = write_scores(tmp_path / "scores.jsonl",
                        {"aime24": 7, "amc": 41, "math500": 376, "minerva": 70, "olympiadbench": 263})
    table, warnings = evaluate.tables_from_files([path], ["1.5B - GRPO (ours)"], paper=False)
    assert warnings == []
    assert table.splitlines()[:3] == [
        "| Model | AIME24 | AMC | MATH500 | Minerva | Olympiad Bench | Avg. |",
        "|---|---:|---:|---:|---:|---:|---:|",
        "| 1.5B - GRPO (ours) | 23.3 ± 7.9 | 49.4 ± 5.5 | 75.2 ± 1.9 | 25.7 ± 2.7 | 39.0 ± 1.9 | 42.5 ± 2.1 |",
    ]
    assert "pass@k" not in table  # one sample per problem: pass@k is pass@1


def test_sampled_runs_over_seeds_beside_the_paper(tmp_path, capsys):
    samples = {"aime24": 32, "amc": 16, "math500": 4, "minerva": 4, "olympiadbench": 4}
    # The paper's 1.5B APO row but MATH500: 244/960 = 25.42, 721/1328 = 54.29, 1580/2000 = 79.00 (78.9 + 0.1),
    # 341/1088 = 31.34, 1085/2700 = 40.19; average 46.05
    paper_row = {"aime24": 244, "amc": 721, "math500": 1580, "minerva": 341, "olympiadbench": 1085}
    seeds = [write_scores(tmp_path / f"apo{seed}.jsonl", {b: c + shift for b, c in paper_row.items()}, samples)
             for seed, shift in enumerate((0, 32, -32))]
    alone = write_scores(tmp_path / "grpo.jsonl", {b: c * k // 2 for (b, c), k in
                                                    zip(COUNTS.items(), samples.values())}, samples)
    args = ["--table", *seeds, alone, "--paper"] + ["--name", "1.5B - APO"] * 3 + ["--name", "1.5B - GRPO"]
    assert evaluate.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| 1.5B - APO (paper) | 25.4 | 54.3 | 78.9 | 31.3 | 40.2 | 46.0 |"
    # Seeds at 244, 276, 212 right of 960 on AIME24: 25.42, 28.75, 22.08 -> mean 25.42, SE across the three
    # 3.33 / sqrt(3) = 1.92 (std ddof 1 of +-3.33 and 0 is 3.33); AMC +-32/1328 = +-2.41: SE 1.39; MATH500
    # +-1.6: 0.92; Minerva +-2.94: 1.70; OlympiadBench +-1.19: 0.68; the runs' averages move together, by
    # (3.33 + 2.41 + 1.6 + 2.94 + 1.19) / 5 = 2.29: SE 1.32.
    assert lines[3] == ("| 1.5B - APO (3 runs) | 25.4 ± 1.9 | 54.3 ± 1.4 | 79.0 ± 0.9 | 31.3 ± 1.7 | 40.2 ± 0.7 "
                        "| 46.0 ± 1.3 |")
    # +0.02, -0.01, +0.1, +0.04, -0.01, +0.05 against 4.303 SE: all within
    assert lines[4] == ("| gap to the paper | +0.0 within noise | -0.0 within noise | +0.1 within noise "
                        "| +0.0 within noise | -0.0 within noise | +0.0 within noise |")
    assert lines[5] == "| 1.5B - GRPO (paper) | 23.3 | 49.4 | 75.2 | 25.7 | 39.0 | 42.5 |"
    # Half the samples right, the first problems solved outright: AIME24 15 of 30 solved, 15 not: 50.0 ±
    # 100 sqrt(0.25 x 30/29) / sqrt(30) = 9.3 between problems, and no sampling noise (each problem all right or
    # all wrong); 26.7 above 23.3. AMC 664 of 1,328: 41 problems solved, one half (8 of 16), 41 not: 50.0 ± 5.5
    # (std 50 sqrt(82/82) over sqrt(83)); sampling SE 100 sqrt(0.25 / 15) / 83 = 0.16. One run: no verdict.
    assert lines[6].startswith("| 1.5B - GRPO | 50.0 ± 9.3 | 50.0 ± 5.5 |")
    assert lines[7].startswith("| gap to the paper | +26.7 (one run; sampling SE 0.0) | +0.6 (one run; sampling SE "
                               "0.2) |")
    assert "Student's t(runs - 1)" in lines[9]
    # pass@k: the first seed's AIME24 has 244 = 7 x 32 + 20 right: 8 problems with a right sample of 30 = 26.7;
    # the others 276 = 8 x 32 + 20 -> 9/30 = 30.0 and 212 = 6 x 32 + 20 -> 7/30 = 23.3: mean 26.7
    pass_rows = lines[lines.index("pass@k (%), k = samples per problem:") + 4:]
    assert pass_rows[0].startswith("| 1.5B - APO (3 runs) | 26.7 (k=32) |")


def test_runs_not_named_after_a_paper_row_are_shown_with_the_paper_table(tmp_path, capsys):
    a = write_scores(tmp_path / "a.jsonl", {b: c // 2 for b, c in COUNTS.items()})
    b = write_scores(tmp_path / "b.jsonl", {b: c for b, c in COUNTS.items()})
    assert evaluate.main(["--table", a, b, "--name", "half", "--name", "all", "--paper"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[2] == "| 1.5B - GRPO (paper) | 23.3 | 49.4 | 75.2 | 25.7 | 39.0 | 42.5 |"
    assert lines[7] == "| 7B - APO (paper) | 45.5 | 65.6 | 84.9 | 35.1 | 43.5 | 54.9 |"
    # 15/30, 41/83, 250/500, 136/272, 337/675 -> 50.0, 49.4, 50.0, 50.0, 49.9
    assert lines[8].startswith("| half | 50.0 ± 9.3 | 49.4 ± 5.5 | 50.0 ± 2.2 | 50.0 ± 3.0 | 49.9 ± 1.9 |")
    assert lines[9] == "| all | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 ± 0.0 | 100.0 ± 0.0 |"
    assert "warning: half: no row of the paper's table to compare with (name it like '1.5B - APO')" in captured.err


def test_runs_are_matched_to_the_papers_rows_by_name_or_run_folder():
    label = lambda name: (evaluate.paper_row_for(name) or ("none",))[0]  # noqa: E731
    assert label("1.5B - APO") == "1.5B - APO (paper)"
    assert label("7b - dr. grpo seed 2") == "7B - Dr. GRPO (paper)"
    assert label("1.5B - GRPO (3 runs)") == "1.5B - GRPO (paper)"
    assert label("qwen2.5-math-7b-drgrpo-data.seed=2-1a2b3c4d-global_step_1320") == "7B - Dr. GRPO (paper)"
    assert label("qwen2.5-math-1.5b-apo-eb729846-global_step_640") == "1.5B - APO (paper)"
    assert label("1.5B - APOX") == "none" and label("qwen2.5-math-1.5b-apox-1") == "none"
    assert label("1.5B - base") == "none"


def test_paper_rows_average_as_printed():
    # The paper averages unrounded scores: its 7B GRPO row's cells average 51.24, printed 51.3.
    for name, cells, average in evaluate.PAPER_ROWS:
        assert abs(sum(cells) / len(cells) - average) < 0.1, name


def test_incomplete_results_are_flagged(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text("\n".join(json.dumps({"benchmark": "aime24", "score": s}) for s in (1, 0, 0, 1)) + "\n")
    table, warnings = evaluate.tables_from_files([str(path)], ["partial"], paper=False)
    # 1, 0, 0, 1: mean 50, SE 28.9 (std ddof 1 57.7 over sqrt 4)
    assert table.splitlines()[2] == "| partial | 50.0 ± 28.9 | - | - | - | - | - |"
    assert "partial: AIME24 has 4 scored problems, the paper uses 30" in warnings
    assert len(warnings) == 5


# ---- scoring and a validation dump ---------------------------------------------------------------------------


def generation_rows(samples):
    """main_generation_server's output: the prepared rows plus `samples` responses per row, the first right on
    even problems, the others wrong."""
    rows = []
    for benchmark, count in COUNTS.items():
        for index in range(count):
            right = index % 2 == 0
            rows.append({
                "data_source": benchmark,
                "prompt": [{"role": "user", "content": f"q{index}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": "\\frac{1}{2}"},
                "extra_info": {"index": index, "answers": ["\\frac{1}{2}"]},
                "responses": ["... \\boxed{0.5}" if right else "... \\boxed{2}"] + ["\\boxed{3}"] * (samples - 1),
            })
    return rows


def test_score_stage_on_sampled_generations(tmp_path, capsys):
    generations = tmp_path / "run" / "generations.parquet"
    generations.parent.mkdir()
    pd.DataFrame(generation_rows(2)).to_parquet(generations)
    assert evaluate.main(["--score", str(generations), "--name", "test"]) == 0
    out = capsys.readouterr().out
    # Half the problems one right of two: 25.0 (AMC 42/83 / 2 = 25.3); pass@2 50.0 (AMC 42/83 = 50.6). SE on
    # AIME24: fractions 50 and 0, fifteen each: std (ddof 1) 25 sqrt(30/29) = 25.43, / sqrt(30) = 4.6
    assert "| test | 25.0 ± 4.6 | 25.3 ± 2.8 | 25.0 ± 1.1 | 25.0 ± 1.5 | 25.0 ± 1.0 | 25.1 ± 1.2 |" in out
    assert "| test | 50.0 (k=2) | 50.6 (k=2) | 50.0 (k=2) | 50.0 (k=2) | 50.1 (k=2) |" in out
    scored = [json.loads(line) for line in open(tmp_path / "run" / "scores.jsonl")]
    assert len(scored) == 1560 and scored[1]["answers"] == ["2", "3"] and scored[0]["scores"] == [1.0, 0.0]
    assert (tmp_path / "run" / "results.md").read_text().startswith("| Model |")


def prepared(tmp_path, benchmarks):
    """prepare_data.py's files, a few problems each: ground truths <benchmark>-0, <benchmark>-1, ..."""
    data = tmp_path / "data"
    data.mkdir()
    for name, count in benchmarks.items():
        pd.DataFrame([{"data_source": name, "prompt": [{"role": "user", "content": f"{name} {i}"}],
                       "reward_model": {"ground_truth": f"{name}-{i}"}, "extra_info": {"index": i}}
                      for i in range(count)]).to_parquet(data / f"{name}.parquet")
    return data


def test_a_validation_dump_is_tabulated_with_its_standard_errors(tmp_path, capsys):
    data = prepared(tmp_path, {"aime24": 2, "amc": 3})
    # verl's dump: the prompts of data.val_files in order, each val_kwargs.n = 2 times in a row
    scores = {("aime24", 0): [1, 1], ("aime24", 1): [0, 1], ("amc", 0): [0, 0], ("amc", 1): [1, 0],
              ("amc", 2): [1, 1]}
    dump = tmp_path / "checkpoints" / "qwen2.5-math-1.5b-apo-x" / "validation" / "1320.jsonl"
    dump.parent.mkdir(parents=True)
    dump.write_text("".join(json.dumps({"input": f"user\n{b} {i}\nassistant\n", "output": "...", "gts": f"{b}-{i}",
                                        "score": s, "step": 1320}) + "\n"
                            for (b, i), pair in scores.items() for s in pair))
    out = tmp_path / "eval"
    assert evaluate.main(["--validation", str(dump), "--data-dir", str(data), "--benchmarks", "aime24,amc",
                          "--out-dir", str(out)]) == 0
    captured = capsys.readouterr()
    # AIME24: fractions 100, 50 -> 75.0, SE 25.0 (|100 - 50| / 2); AMC: 0, 50, 100 -> 50.0, SE 50 / sqrt(3) = 28.9
    # pass@2: AIME24 2/2 = 100.0, AMC 2/3 = 66.7
    assert "| qwen2.5-math-1.5b-apo-x-validation_1320 | 75.0 ± 25.0 | 50.0 ± 28.9 | - | - | - | - |" in captured.out
    assert "| qwen2.5-math-1.5b-apo-x-validation_1320 | 100.0 (k=2) | 66.7 (k=2) | - | - | - |" in captured.out
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert [(r["benchmark"], r["index"], r["scores"]) for r in rows][1] == ("aime24", 1, [0.0, 1.0])
    # The benchmarks in another order than the run validated them: refused, naming the first misfit
    with pytest.raises(ValueError, match=r"responses 1-2 are not the 2 samples of amc problem 0 \(ground truth "
                                         r"'amc-0'\): validated in another order than --benchmarks amc,aime24\?"):
        evaluate.scores_from_validation(str(dump), str(data), ["amc", "aime24"])
    # The command says it in one line, exit status 2
    capsys.readouterr()
    assert evaluate.main(["--validation", str(dump), "--data-dir", str(data), "--benchmarks", "amc",
                          "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "10 responses are not the same number for each of the 3 problems of amc" in err[0]


# ---- generation ----------------------------------------------------------------------------------------------


def dry_run_commands(capsys, *args):
    assert evaluate.main(["--dry-run", "--data-dir", "/data/recipe_apo", "--python", "py", *args]) == 0
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("+ ")]


def test_generation_samples_each_benchmark_its_default_times(tmp_path, capsys):
    actor = tmp_path / "global_step_640" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text("{}")
    out = tmp_path / "eval"
    commands = dry_run_commands(capsys, "--model", str(tmp_path / "global_step_640"), "--out-dir", str(out),
                                "--ngpus", "4")
    assert commands[0] == (f"+ py -m verl.model_merger merge --backend fsdp --local_dir {actor} "
                           f"--target_dir {out}/hf_model")
    # One server run per distinct k: 32 (AIME24), 16 (AMC), 4 (the other three)
    assert len(commands) == 4
    for command, (k, names) in zip(commands[1:], [(32, ["aime24"]), (16, ["amc"]),
                                                 (4, ["math500", "minerva", "olympiadbench"])]):
        assert command.startswith("+ py -m verl.trainer.main_generation_server ")
        files = ",".join(f"/data/recipe_apo/{name}.parquet" for name in names)
        for part in (f"data.train_files=[{files}]", f"+data.output_path={out}/generations.n{k}.parquet",
                     f"actor_rollout_ref.model.path={out}/hf_model", f"actor_rollout_ref.rollout.n={k} ",
                     "actor_rollout_ref.rollout.temperature=1.0 ", "actor_rollout_ref.rollout.top_p=1.0 ",
                     "data.max_response_length=3000", "trainer.n_gpus_per_node=4"):
            assert part in command, (part, command)


def test_without_a_gpu_the_command_gets_the_cpus_setup_and_one_replica(tmp_path, capsys, monkeypatch):
    from recipe_apo.cpu import generation

    calls = []
    monkeypatch.setattr(evaluate, "run", lambda command, dry_run, env=None: calls.append((command, env)))
    monkeypatch.setattr(generation, "has_gpu", lambda: False)
    monkeypatch.setattr(generation, "engine", lambda: "vllm")
    assert evaluate.main(["--model", "m", "--out-dir", str(tmp_path), "--greedy", "--dry-run"]) == 0
    ((command, env),) = calls
    assert "trainer.n_gpus_per_node=1" in command
    # After the command's own settings (a GPU's vLLM), the CPU's; the user's --generation-override last (Hydra: the
    # last one wins).
    for part in ("+actor_rollout_ref.rollout.enable_sleep_mode=false",
                 "+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "trainer.device=cpu"):
        assert command.count(part) == 1, part
    names = [part for part in command if part.startswith("actor_rollout_ref.rollout.name=")]
    assert names == ["actor_rollout_ref.rollout.name=vllm"] * 2
    assert env["VERL_PLATFORM"] == "cpu" and env["VERL_USE_EXTERNAL_MODULES"] == "recipe_apo.cpu.activate"
    assert json.loads(env["RAY_OVERRIDE_RESOURCES"]) == {"CPU": 16, "GPU": 1}
    calls.clear()
    assert evaluate.main(["--model", "m", "--out-dir", str(tmp_path), "--greedy", "--dry-run", "--ngpus", "2",
                          "--generation-override", "actor_rollout_ref.rollout.name=hf"]) == 0
    ((command, env),) = calls
    assert command[-1] == "actor_rollout_ref.rollout.name=hf" and "trainer.n_gpus_per_node=2" in command
    assert "actor_rollout_ref.rollout.name=vllm" in command  # the command's own, before the user's
    assert json.loads(env["RAY_OVERRIDE_RESOURCES"])["GPU"] == 2
    # A "+key" the user gives is left to them: Hydra refuses one given twice.
    calls.clear()
    assert evaluate.main(["--model", "m", "--out-dir", str(tmp_path), "--greedy", "--dry-run", "--generation-override",
                          "+actor_rollout_ref.model.override_config.attn_implementation=eager"]) == 0
    ((command, env),) = calls
    assert [p for p in command if "attn_implementation" in p] == [
        "+actor_rollout_ref.model.override_config.attn_implementation=eager"]
    # On a GPU machine: the command as written, every GPU, the caller's environment.
    calls.clear()
    monkeypatch.setattr(generation, "has_gpu", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 8)
    assert evaluate.main(["--model", "m", "--out-dir", str(tmp_path), "--greedy", "--dry-run"]) == 0
    ((command, env),) = calls
    assert env is None and "trainer.n_gpus_per_node=8" in command
    assert not any("sdpa" in part or "device=cpu" in part for part in command)


def test_greedy_and_chosen_sampling(tmp_path, capsys):
    (greedy,) = dry_run_commands(capsys, "--model", "Qwen/Qwen2.5-Math-1.5B", "--out-dir", str(tmp_path), "--greedy")
    for part in ("actor_rollout_ref.rollout.n=1 ", "actor_rollout_ref.rollout.temperature=0.0 ",
                 f"+data.output_path={tmp_path}/generations.parquet"):
        assert part in greedy
    same = greedy.replace("model.path=Qwen/Qwen2.5-Math-1.5B", "model.path=m")
    assert dry_run_commands(capsys, "--model", "m", "--out-dir", str(tmp_path), "--temperature", "0") == [same]
    (sampled,) = dry_run_commands(capsys, "--model", "m", "--out-dir", str(tmp_path), "--n", "8",
                                  "--temperature", "0.6", "--top-p", "0.95")
    for part in ("actor_rollout_ref.rollout.n=8 ", "actor_rollout_ref.rollout.temperature=0.6 ",
                 "actor_rollout_ref.rollout.top_p=0.95 "):
        assert part in sampled
    some = dry_run_commands(capsys, "--model", "m", "--out-dir", str(tmp_path), "--n", "aime24=64,math500=2")
    assert [c.split("actor_rollout_ref.rollout.n=")[1].split()[0] for c in some] == ["64", "16", "2", "4"]


@pytest.mark.parametrize("args, message", [
    (["--n", "0"], "--n: samples per problem must be 1 or more, got 0"),
    (["--n", "four"], "--n: 'four' is not a whole number of samples"),
    (["--n", "aime=4"], "--n: 'aime' is not one of --benchmarks (aime24, amc, math500, minerva, olympiadbench)"),
    (["--temperature", "-0.5"], "--temperature must be 0 (greedy) or more, got -0.5"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--greedy", "--n", "4"], "--n > 1 needs sampling: greedy decoding (--greedy or --temperature 0) gives "
                               "identical answers"),
    (["--temperature", "0", "--n", "aime24=2"], "--n > 1 needs sampling: greedy decoding (--greedy or "
                                                "--temperature 0) gives identical answers"),
    (["--greedy", "--temperature", "0.6"], "--greedy decodes at temperature 0, got --temperature 0.6"),
])
def test_bad_sampling_settings_are_refused_in_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--model", "m", "--dry-run", *args])
    assert exit_info.value.code == 2
    assert error_line(capsys).endswith(f": error: {message}")


def test_default_run_labels():
    label = "qwen2.5-math-1.5b-apo-global_step_640"
    assert evaluate.model_label("ckpt/recipe_apo/qwen2.5-math-1.5b-apo/global_step_640") == label
    assert evaluate.model_label("ckpt/qwen2.5-math-1.5b-apo/global_step_640/actor/") == label
    assert evaluate.model_label("Qwen/Qwen2.5-Math-1.5B") == "Qwen2.5-Math-1.5B"
    assert evaluate.validation_label("ckpt/recipe_apo/run-x/validation/640.jsonl") == "run-x-validation_640"


def test_hub_models_are_not_merged(tmp_path, capsys):
    assert evaluate.main(["--model", "Qwen/Qwen2.5-Math-1.5B", "--out-dir", str(tmp_path), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "nothing to merge" in err and "model_merger" not in err
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B" in err


def test_a_generation_run_per_distinct_k_joined_and_scored(tmp_path, capsys, monkeypatch):
    data = prepared(tmp_path, {"aime24": 2, "amc": 3})

    def fake_server(command, dry_run, env=None):
        # What main_generation_server writes: the prompts' rows, each with rollout.n responses; the first right
        settings = dict(part.split("=", 1) for part in command if "=" in part)
        files = settings["data.train_files"].strip("[]").split(",")
        frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        k = int(settings["actor_rollout_ref.rollout.n"])
        frame["responses"] = [[f"\\boxed{{{rm['ground_truth']}}}"] + ["\\boxed{0}"] * (k - 1)
                              for rm in frame["reward_model"]]
        frame.to_parquet(settings["+data.output_path"])

    monkeypatch.setattr(evaluate, "run", fake_server)
    out = tmp_path / "eval"
    assert evaluate.main(["--model", "m", "--data-dir", str(data), "--benchmarks", "aime24,amc",
                          "--n", "aime24=2,amc=3", "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["generations.n2.parquet", "generations.n3.parquet",
                                                     "generations.parquet", "results.md", "scores.jsonl"]
    joined = pd.read_parquet(out / "generations.parquet")
    assert list(joined["data_source"]) == ["aime24", "aime24", "amc", "amc", "amc"]
    assert [len(r) for r in joined["responses"]] == [2, 2, 3, 3, 3]
    # One right of 2 (AIME24): 50.0, SE 0 (both problems alike), pass@2 100; one of 3 (AMC): 33.3, pass@3 100
    out_text = capsys.readouterr().out
    assert "| m | 50.0 ± 0.0 | 33.3 ± 0.0 | - | - | - | - |" in out_text
    assert "| m | 100.0 (k=2) | 100.0 (k=3) | - | - | - |" in out_text


def test_validation_and_generation_scores_are_never_pooled_in_one_table(tmp_path, capsys):
    """One checkpoint scored both ways differs by its truncated right answers (validation gives them 0): a table
    of files of both paths is one line on stderr, exit status 2."""
    rows = {"validation": {"benchmark": "aime24", "score": 0.5, "scores": [1, 0], "scored_by": "validation"},
            "generation": {"benchmark": "aime24", "score": 1.0, "scores": [1, 1], "scored_by": "generation"}}
    paths = []
    for name, row in rows.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        paths.append(str(path))
    assert evaluate.main(["--table", *paths]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"evaluate.py: error: {paths[0]} was scored from a validation dump")
    for path in paths:  # each path alone tabulates
        assert evaluate.main(["--table", path]) == 0


def _scores_file(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _refused(capsys, *args) -> str:
    capsys.readouterr()
    assert evaluate.main(list(args)) == 2
    err = capsys.readouterr().err.splitlines()
    # progress lines ("[3/3] scoring ...") may come first; the error is the one last line
    assert err and err[-1].startswith("evaluate.py: error: ") and not any("Traceback" in line for line in err), err
    assert sum(line.startswith("evaluate.py: error: ") for line in err) == 1
    return err[-1]


PROBLEMS = [{"benchmark": "aime24", "index": i, "score": s, "scores": [s, s]} for i, s in enumerate([1.0, 0.0])]


def test_files_are_pooled_only_when_named_as_seeds_of_one_method_on_the_same_problems(tmp_path, capsys):
    grpo = _scores_file(tmp_path / "results" / "grpo.jsonl", PROBLEMS)
    apo = _scores_file(tmp_path / "results" / "apo.jsonl", PROBLEMS)
    # Unnamed files in one folder: a row each, never "results (2 runs)"
    assert evaluate.main(["--table", grpo, apo]) == 0
    out = capsys.readouterr().out
    assert "(2 runs)" not in out and grpo in out and apo in out
    # The same file twice is not two seeds
    assert "is given twice" in _refused(capsys, "--table", grpo, grpo, "--name", "m", "--name", "m")
    # Seeds of one method scored on other problems
    other = _scores_file(tmp_path / "other.jsonl", [{**PROBLEMS[0], "index": 7}, PROBLEMS[1]])
    assert "score different problems" in _refused(capsys, "--table", grpo, other, "--name", "m", "--name", "m")
    # Named as seeds on the same problems: pooled
    assert evaluate.main(["--table", grpo, apo, "--name", "m", "--name", "m"]) == 0
    assert "| m (2 runs) |" in capsys.readouterr().out


@pytest.mark.parametrize("row, said", [
    ({"benchmark": "aime24", "score": 5}, "score 5 is not a number in [0, 1]"),
    ({"benchmark": "aime24", "score": -1}, "score -1 is not a number in [0, 1]"),
    ({"benchmark": "aime24", "score": float("nan")}, "score nan is not a number in [0, 1]"),
    ({"benchmark": "aime24", "score": 1.0, "scores": [0, 0, 0, 0]}, "score 1.0 is not the mean of its scores"),
    ({"benchmark": "aime24", "score": 0.5, "scores": [1, 2]}, "is not a non-empty list of numbers in [0, 1]"),
    ({"benchmark": "", "score": 0.5}, "is not a benchmark's name"),
])
def test_impossible_scores_are_refused_naming_the_line(tmp_path, capsys, row, said):
    path = _scores_file(tmp_path / "s.jsonl", [row])
    line = _refused(capsys, "--table", path)
    assert f"{path}:1: " in line and said in line


def test_unreadable_inputs_are_one_line(tmp_path, capsys):
    empty = _scores_file(tmp_path / "empty.jsonl", [])
    assert "an empty scores file" in _refused(capsys, "--table", empty)
    twice = _scores_file(tmp_path / "twice.jsonl", [PROBLEMS[0], PROBLEMS[0]])
    assert "aime24 problem 0 is scored twice" in _refused(capsys, "--table", twice)
    truncated = tmp_path / "cut.jsonl"
    truncated.write_text('{"benchmark": "aime24", "sco')
    assert str(truncated) in _refused(capsys, "--table", str(truncated))
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\n")
    assert "not UTF-8" in _refused(capsys, "--table", str(binary))
    assert "a folder, not a file" in _refused(capsys, "--table", str(tmp_path))
    assert "cannot be read" in _refused(capsys, "--table", str(tmp_path / "missing.jsonl"))
    bad_parquet = tmp_path / "gen.parquet"
    bad_parquet.write_bytes(b"PAR1 not really")
    assert "not a readable parquet file" in _refused(capsys, "--score", str(bad_parquet), "--dry-run")
    dump = _scores_file(tmp_path / "validation" / "1.jsonl", [{"input": "x", "gts": "1", "score": 1.0}])
    assert "missing" in _refused(capsys, "--validation", dump, "--data-dir", str(tmp_path / "nodata"))
    assert "no such file" in _refused(capsys, "--score", str(tmp_path / "nothing.parquet"), "--dry-run")


def test_benchmarks_outside_the_papers_table_get_columns_of_their_own(tmp_path, capsys):
    rows = [{"benchmark": "gym_add_1digit", "index": 0, "score": 0.5, "scores": [1, 0]},
            {"benchmark": "gym_add_1digit", "index": 1, "score": 1.0, "scores": [1, 1]},
            {"benchmark": "gym_addsub_1digit", "index": 0, "score": 0.0, "scores": [0, 0]}]
    path = tmp_path / "scores.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert evaluate.main(["--table", str(path), "--name", "base", "--paper"]) == 0
    captured = capsys.readouterr()
    # 75.0 +- 25.0 (two problems, 0.5 and 1.0); one problem at 0: no SE; their mean 37.5.
    assert "| Model | gym_add_1digit | gym_addsub_1digit | Avg. |" in captured.out
    assert "| base | 75.0 ± 25.0 | 0.0 | 37.5 |" in captured.out
    assert "(paper)" not in captured.out and "the paper uses" not in captured.err



# ---- hostile input: scores on every path, names, problem keys, files by identity --------------------------------


def validation_dump(tmp_path, scores):
    """A validation dump of one AIME24 problem (the prepared file's only one), one response per score."""
    data = prepared(tmp_path, {"aime24": 1})
    dump = tmp_path / "ckpt" / "run" / "validation" / "5.jsonl"
    dump.parent.mkdir(parents=True)
    dump.write_text("".join('{"input": "user\\naime24 0\\nassistant\\n", "output": "...", "gts": "aime24-0", '
                            f'"score": {score}}}\n' for score in scores))
    return data, dump


@pytest.mark.parametrize("score, shown", [("5", "5"), ("-1", "-1"), ("NaN", "nan"), ("Infinity", "inf"),
                                          ('"x"', "'x'"), ("true", "True"), ("null", "None"), ("[1]", "[1]"),
                                          ("1" + "0" * 400, "1000")])
def test_a_validation_dump_with_an_impossible_score_is_refused_naming_its_line(tmp_path, capsys, monkeypatch,
                                                                                score, shown):
    data, dump = validation_dump(tmp_path, ["1.0", score])
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, "--validation", str(dump), "--data-dir", str(data), "--benchmarks", "aime24")
    assert f"{dump}:2: score {shown}" in line and "is not a number in [0, 1]" in line
    assert not (tmp_path / "eval").exists()  # nothing written


def write_reward(tmp_path, body):
    path = tmp_path / "my_reward.py"
    path.write_text("import math\nimport numpy as np\n\n\ndef compute_score(data_source, solution_str, ground_truth, "
                    f"extra_info=None):\n    return {body}\n")
    return str(path)


def small_generations(tmp_path):
    generations = tmp_path / "run" / "generations.parquet"
    generations.parent.mkdir()
    pd.DataFrame([{"data_source": "aime24", "reward_model": {"ground_truth": "1"}, "extra_info": {"index": i},
                   "responses": ["\\boxed{1}", "\\boxed{2}"]} for i in range(2)]).to_parquet(generations)
    return generations


@pytest.mark.parametrize("body, shown", [("5", "5"), ("-1.0", "-1.0"), ("float('nan')", "nan"), ("'x'", "'x'"),
                                         ("None", "None"), ("{'acc': 1.0}", "{'acc': 1.0}"),
                                         ("np.float32(2.0)", "2.0"), ("math.inf", "inf")])
def test_a_custom_reward_giving_an_impossible_score_is_refused_naming_the_response(tmp_path, capsys, body, shown):
    generations = small_generations(tmp_path)
    line = _refused(capsys, "--score", str(generations), "--reward-path", write_reward(tmp_path, body),
                    "--reward-name", "compute_score")
    assert f"{generations}: row 1 ('aime24'), response 1: the reward gave {shown}, not a number in [0, 1]" in line
    assert sorted(p.name for p in generations.parent.iterdir()) == ["generations.parquet"]  # nothing written


@pytest.mark.parametrize("body", ["True", "np.float32(1.0)", "{'score': 1}", "1"])
def test_a_custom_reward_in_verls_forms_is_read_as_verl_reads_it(tmp_path, capsys, body):
    generations = small_generations(tmp_path)
    assert evaluate.main(["--score", str(generations), "--reward-path", write_reward(tmp_path, body),
                          "--reward-name", "compute_score", "--name", "custom"]) == 0
    # every response right: 100.0, SE 0 over the two problems
    assert "| custom | 100.0 ± 0.0 | - | - | - | - | - |" in capsys.readouterr().out


def test_a_generations_row_without_responses_is_refused(tmp_path, capsys):
    generations = tmp_path / "generations.parquet"
    pd.DataFrame([{"data_source": "aime24", "reward_model": {"ground_truth": "1"}, "extra_info": {"index": 3},
                   "responses": []}]).to_parquet(generations)
    line = _refused(capsys, "--score", str(generations), "--reward-path", write_reward(tmp_path, "1.0"),
                    "--reward-name", "compute_score")
    assert f"{generations}: row 1 ('aime24' problem 3) has no responses" in line


@pytest.mark.parametrize("name", ["..", ".", "...", "../.."])
def test_a_name_of_dots_is_never_a_folder_and_nothing_is_written(tmp_path, capsys, monkeypatch, name):
    data, dump = validation_dump(tmp_path, ["1.0", "0.0"])
    work = tmp_path / "work"
    (work / "eval").mkdir(parents=True)
    monkeypatch.chdir(work / "eval")  # eval/.. would be the working folder
    if "/" in name:  # a path separator: a name of its own, mapped to a folder under eval/
        assert evaluate.main(["--validation", str(dump), "--data-dir", str(data), "--benchmarks", "aime24",
                              "--name", name]) == 0
        (folder,) = (work / "eval" / "eval").iterdir()
        assert folder.name.startswith("_..-") and (folder / "scores.jsonl").is_file()
    else:
        line = _refused(capsys, "--validation", str(dump), "--data-dir", str(data), "--benchmarks", "aime24",
                        "--name", name)
        assert f"the row name {name!r} (--name, or the model's or dump's own) makes no folder of its own" in line
        assert sorted(p.name for p in work.rglob("*")) == ["eval"]
    assert not (work / "scores.jsonl").exists() and not (work / "eval" / "scores.jsonl").exists()


def test_names_map_to_folders_under_eval_and_two_names_never_share_one():
    assert evaluate.out_folder("1.5B - APO") == os.path.join("eval", "1.5B_-_APO")  # as before: spaces as _
    mapped = {name: evaluate.out_folder(name) for name in ("a/b", "a\\b", "a_b-x", "a:b", "APO α", "APO β", "x" * 300)}
    assert len(set(mapped.values())) == len(mapped) and mapped["a_b-x"] == os.path.join("eval", "a_b-x")
    for folder in mapped.values():
        head, tail = os.path.split(folder)
        assert head == "eval" and len(tail) <= 100 and tail.strip(".")
        assert all(ch.isalnum() or ch in "._+-" for ch in tail)
    assert evaluate.out_folder("a/b") == evaluate.out_folder("a/b")  # the same name, the same folder


def test_the_default_name_of_a_model_folder_of_dots_is_refused_too(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, "--model", "..", "--dry-run", "--greedy")
    assert "the row name '..'" in line and "give --out-dir or another --name" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, said", [
    (["--name", ""], "--name '' is blank"),
    (["--name", "  "], "is blank: a row of the table needs a name"),
    (["--name", "a\nb"], "--name 'a\\nb' holds a control character"),
    (["--name", "a", "--name", "b"], "--name is given 2 times: --validation makes one row"),
])
def test_bad_names_are_refused_in_one_line(tmp_path, capsys, monkeypatch, args, said):
    data, dump = validation_dump(tmp_path, ["1.0"])
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, "--validation", str(dump), "--data-dir", str(data), "--benchmarks", "aime24", *args)
    assert said in line
    assert not (tmp_path / "eval").exists()


def cells(line):
    """A markdown row's cells, split where GitHub splits them: at a | without a backslash before it."""
    import re

    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


def test_a_name_or_benchmark_holding_a_bar_stays_in_its_cell(tmp_path, capsys):
    path = _scores_file(tmp_path / "s.jsonl", [{"benchmark": "gym|x\ny", "index": 0, "score": 1.0, "scores": [1, 1]}])
    assert evaluate.main(["--table", path, "--name", "A | B |"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| Model | gym\\|x y | Avg. |"
    assert lines[2] == "| A \\| B \\| | 100.0 | 100.0 |"
    table_rows = [line for line in lines if line.startswith("|")]
    assert {len(cells(line)) for line in table_rows[:3]} == {3}
    assert all(len(cells(line)) == 2 for line in table_rows[3:])  # the pass@k table: no Avg.


def indexless(path, counts):
    """A scores file without indices: ``counts[b]`` problems of each benchmark b, half of them right."""
    return _scores_file(path, [{"benchmark": b, "score": float(i % 2)} for b, n in counts.items() for i in range(n)])


def test_seeds_without_an_index_on_different_problem_sets_are_not_pooled(tmp_path, capsys):
    full = indexless(tmp_path / "s1" / "scores.jsonl", {"amc": 83})
    part = indexless(tmp_path / "s2" / "scores.jsonl", {"amc": 10})
    line = _refused(capsys, "--table", full, part, "--name", "m", "--name", "m")
    assert f"{part} and {full}, both --name 'm', score different problems (amc 10 against amc 83)" in line
    # Named apart, each is a row of its own
    assert evaluate.main(["--table", full, part, "--name", "m83", "--name", "m10"]) == 0
    out = capsys.readouterr().out
    assert "| m83 |" in out and "| m10 |" in out
    # The same count of each benchmark without indices: the same problems, in order; pooled
    again = indexless(tmp_path / "s3" / "scores.jsonl", {"amc": 83})
    assert evaluate.main(["--table", full, again, "--name", "m", "--name", "m"]) == 0
    assert "| m (2 runs) |" in capsys.readouterr().out


@pytest.mark.parametrize("indices", [(0, 0.0), (0, "0"), (0.0, " 0 "), (7, "7.0"), (10, "1e1"), ("a", "a")])
def test_an_index_given_twice_in_two_spellings_is_one_problem_scored_twice(tmp_path, capsys, indices):
    path = _scores_file(tmp_path / "s.jsonl", [{"benchmark": "aime24", "index": i, "score": 1.0} for i in indices])
    line = _refused(capsys, "--table", path)
    assert f"{path}:2: aime24 problem {indices[1]!r} is scored twice (line 1 too" in line


def test_indices_compare_as_numbers_across_seeds_and_text_stays_text(tmp_path, capsys):
    numbers = _scores_file(tmp_path / "a.jsonl", [{"benchmark": "aime24", "index": i, "score": 1.0} for i in (0, 1)])
    texts = _scores_file(tmp_path / "b.jsonl", [{"benchmark": "aime24", "index": i, "score": 0.0}
                                                for i in ("0", "1.0")])
    assert evaluate.main(["--table", numbers, texts, "--name", "m", "--name", "m"]) == 0
    assert "| m (2 runs) | 50.0 ± 50.0 |" in capsys.readouterr().out  # runs at 100 and 0
    # "a" and "A", "01" and 1, 0 and false: other problems (only numbers compare as numbers; a boolean is no number)
    two = _scores_file(tmp_path / "c.jsonl", [{"benchmark": "aime24", "index": i, "score": 1.0}
                                              for i in ("a", "A", "01x", 1, False, 0)])
    assert evaluate.main(["--table", two]) == 0
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"benchmark": "aime24", "index": NaN, "score": 1.0}\n')
    assert f"{nan}:1: index nan is not a problem's index" in _refused(capsys, "--table", str(nan))


def test_one_file_through_a_link_is_one_run(tmp_path, capsys):
    original = _scores_file(tmp_path / "a" / "scores.jsonl", PROBLEMS)
    hard = tmp_path / "b" / "scores.jsonl"
    hard.parent.mkdir()
    os.link(original, hard)
    soft = tmp_path / "c.jsonl"
    soft.symlink_to(original)
    for other in (str(hard), str(soft), os.path.join(str(tmp_path), "a", "..", "a", "scores.jsonl")):
        line = _refused(capsys, "--table", original, other, "--name", "m", "--name", "m")
        assert f"{original} is given twice (as {other}: a link, or another path to it)" in line
    # A copy is another file: pooled, with a warning (two seeds cannot score alike line for line)
    copy = _scores_file(tmp_path / "d" / "scores.jsonl", PROBLEMS)
    assert evaluate.main(["--table", original, copy, "--name", "m", "--name", "m"]) == 0
    err = capsys.readouterr().err
    assert f"warning: m: {copy} holds the same scores as {original}, line for line: a copy of one run?" in err


def test_the_outputs_replace_a_link_in_their_way_and_a_file_in_the_way_is_one_line(tmp_path, capsys):
    data, dump = validation_dump(tmp_path, ["1.0", "0.0"])
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "scores.jsonl").symlink_to(precious)
    assert evaluate.main(["--validation", str(dump), "--data-dir", str(data), "--benchmarks", "aime24",
                          "--out-dir", str(out)]) == 0
    assert precious.read_text() == "keep me" and not (out / "scores.jsonl").is_symlink()
    assert json.loads((out / "scores.jsonl").read_text())["scores"] == [1.0, 0.0]
    assert oct((out / "scores.jsonl").stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert sorted(p.name for p in out.iterdir()) == ["results.md", "scores.jsonl"]  # no temporary left
    line = _refused(capsys, "--validation", str(dump), "--data-dir", str(data), "--benchmarks", "aime24",
                    "--out-dir", str(precious))
    assert f"{precious}/scores.jsonl: cannot be written" in line and precious.read_text() == "keep me"


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask
