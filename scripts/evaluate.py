#!/usr/bin/env python
"""Mean pass@1 of a model on the paper's five benchmarks, with its standard error, as a markdown table laid out
like the paper's (section 5.2).

    # a trained verl checkpoint (merged to Hugging Face format first) or any Hugging Face model
    python scripts/evaluate.py --model checkpoints/recipe_apo/qwen2.5-math-1.5b-apo/global_step_640 \\
        --name "1.5B - APO" --ngpus 8 --paper
    python scripts/evaluate.py --model Qwen/Qwen2.5-Math-1.5B --name "1.5B - base" --greedy

    # CPU only: score generations written earlier, tabulate scored files (one --name for several files: the
    # runs of one method over seeds, one row), or a training run's validation dump
    python scripts/evaluate.py --score eval/apo/generations.parquet --name "1.5B - APO"
    python scripts/evaluate.py --table eval/grpo/scores.jsonl eval/drgrpo/scores.jsonl eval/apo/scores.jsonl --paper
    python scripts/evaluate.py --validation checkpoints/recipe_apo/<experiment>/validation/1320.jsonl
    python scripts/evaluate.py --attainability   # which samples per problem can give the paper's figures

Three stages, each of which can run on its own:

1. **merge** (verl checkpoints only): ``python -m verl.model_merger merge --backend fsdp`` turns
   ``global_step_N/actor`` into a Hugging Face folder under ``<out-dir>/hf_model``.
2. **generate** (GPUs, or the CPU: a machine without a GPU gets the CPU rehearsal's settings, vLLM's CPU build
   where installed, ``recipe_apo/cpu/generation.py``):
   verl's ``python -m verl.trainer.main_generation_server`` serves the model with vLLM and
   answers every prompt of ``<data-dir>/{aime24,amc,math500,minerva,olympiadbench}.parquet`` (made by
   ``scripts/prepare_data.py``: the Qwen-Math prompt) ``--n`` times each, sampled at ``--temperature`` and
   ``--top-p`` (``--greedy``: once, greedily, like Dr. GRPO's evaluation), at most 3,000 tokens. By default
   32 samples per AIME24 problem, 16 per AMC problem and 4 per problem of the others: with these, every figure
   of the paper's table is a value the benchmark can take (``--attainability``, docs/paper.md). One server
   run per distinct ``--n``; output: ``<out-dir>/generations.parquet``.
3. **score** (CPU): every response through ``recipe_apo.reward.compute_score``, the training reward (or the
   ``--reward-path``/``--reward-name`` function, in verl's custom-reward form); one JSON line per problem in
   ``<out-dir>/scores.jsonl``; the table in ``<out-dir>/results.md`` and on stdout.

Per benchmark: mean pass@1 (the mean over problems of each problem's fraction of right samples) ± its standard
error between problems (the standard deviation of those fractions, ddof 1, over the square root of the number
of problems), and pass@k at k = the samples per problem (Chen et al. 2021's unbiased estimator; a sample is
right when it scores 1). "Avg." is the unweighted mean of the five benchmarks, as in the paper. Files that share
a ``--name`` are runs of one method with different seeds: one row, the mean across runs ± the standard error
across runs. ``--paper`` puts the paper's row above each run named like one of its rows ("1.5B - APO", or a
run folder ``qwen2.5-math-1.5b-apo-...``) and the gap below it: for a row of several runs "beyond noise" only when
it exceeds the 95% critical value times the standard error across runs (the paper gives no error bars: its
figures are taken as exact); for one run no verdict, the gap beside the evaluation's own sampling SE on the same
problems (``sampling_se``), since the seed-to-seed spread of one run is not measured.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections import Counter, defaultdict
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

# (data_source written by prepare_data.py, column title in the paper's table, problems)
BENCHMARKS: tuple[tuple[str, str, int], ...] = (
    ("aime24", "AIME24", 30),
    ("amc", "AMC", 83),
    ("math500", "MATH500", 500),
    ("minerva", "Minerva", 272),
    ("olympiadbench", "Olympiad Bench", 675),
)

# The training reward, as verl's reward.custom_reward_function names it.
DEFAULT_REWARD_PATH, DEFAULT_REWARD_NAME = "pkg://recipe_apo.reward", "compute_score"

# Section 5.2 of the paper. Its last row is printed there as "7.0B - GMPO-7B (Ours)": APO's 7B row.
PAPER_ROWS: tuple[tuple[str, tuple[float, ...], float], ...] = (
    ("1.5B - GRPO (paper)", (23.3, 49.4, 75.2, 25.7, 39.0), 42.5),
    ("1.5B - Dr. GRPO (paper)", (23.0, 52.1, 77.5, 30.1, 38.5), 44.2),
    ("1.5B - APO (paper)", (25.4, 54.3, 78.9, 31.3, 40.2), 46.0),
    ("7B - GRPO (paper)", (40.1, 59.0, 83.4, 32.4, 41.3), 51.3),
    ("7B - Dr. GRPO (paper)", (43.3, 62.7, 80.7, 33.5, 42.9), 52.6),
    ("7B - APO (paper)", (45.5, 65.6, 84.9, 35.1, 43.5), 54.9),
)

# Samples per problem by default (--n). With N problems and k samples each, mean pass@1 moves in steps of
# 100 / (N k) points; these are the k, with some margin, at which each of the paper's six figures of the
# benchmark is a value it can take (``--attainability``; docs/paper.md), at 8,076 responses per model instead
# of greedy's 1,560 (one k of 32 for all five would take 49,920).
DEFAULT_SAMPLES = {"aime24": 32, "amc": 16, "math500": 4, "minerva": 4, "olympiadbench": 4}
OTHER_SAMPLES = 4  # a benchmark outside the paper's table
# The paper does not say how it sampled for evaluation: by default the policy's own distribution, as trained.
DEFAULT_TEMPERATURE, DEFAULT_TOP_P = 1.0, 1.0

# Two-sided 95% critical values of Student's t by degrees of freedom (1-30): the SE across R runs has R - 1.
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
          2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
          2.045, 2.042)
Z_975 = 1.96


# --------------------------------------------------------------------------------------------------------------
# Statistics and the table (pure Python: testable anywhere)
# --------------------------------------------------------------------------------------------------------------


class Estimate(NamedTuple):
    """One benchmark (or the average) of one row, in percent: ``mean`` pass@1 and its standard error ``se``
    (None: not defined, e.g. the paper's figures); ``problems`` scored, ``samples`` per problem (the fewest any
    problem got), ``pass_at_k`` at k = ``samples``, how many ``runs`` (seeds) it pools, and ``sampling_se``, the
    evaluation's own sampling noise on these problems (``sampling_se``; None with one sample per problem). A named
    tuple, not a dataclass: this script is also loaded as a module without an entry in sys.modules (tests)."""

    mean: float
    se: Optional[float] = None
    problems: int = 0
    samples: int = 1
    pass_at_k: Optional[float] = None
    runs: int = 1
    sampling_se: Optional[float] = None


Row = tuple[str, Sequence[Any], Any]  # (name, one cell per benchmark, the average): Estimate, str or None


class EvaluateError(ValueError):
    """A file or a setting the evaluation cannot use; the message, one line, names it and the way out."""


def _score_ok(value: Any) -> bool:
    # Compared, not converted: NaN and infinities fail the comparison, and an integer too large for a float is
    # refused instead of overflowing.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def _shown(value: Any) -> str:
    """A value in a one-line message: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,4})?")


def index_key(value: Any, where: str) -> tuple:
    """A problem's ``index`` as the key that identifies it: a number (given as a number or as text: 0, 0.0 and
    "0" are one problem) compared exactly, other text as itself, anything else by its JSON text. EvaluateError
    (naming ``where``) for NaN or an infinity, which equal no problem."""
    from fractions import Fraction

    if isinstance(value, float) and not math.isfinite(value):
        raise EvaluateError(f"{where}: index {value!r} is not a problem's index (a number, or a text)")
    if isinstance(value, int) and not isinstance(value, bool):
        return ("number", Fraction(value))
    if isinstance(value, float):
        return ("number", Fraction(repr(value)))  # as written: 0.1 is 1/10, as the text "0.1" is
    if isinstance(value, str):
        if _NUMBER.fullmatch(value.strip()):
            try:
                return ("number", Fraction(value.strip()))
            except ValueError:  # more digits than Python converts
                pass
        return ("text", value)
    return ("json", json.dumps(value, sort_keys=True))


def problem_keys(rows: Sequence[dict], path: str = "", lines: Optional[Sequence[int]] = None) -> list[tuple]:
    """Each row's problem: (benchmark, its ``index`` as ``index_key``), or for a row without one (or with a null
    one) (benchmark, its position among the benchmark's rows without an index): files written without indices
    are the same problems only where they hold the same number of each benchmark's, in the same order.
    ``lines``: the rows' line numbers in ``path``, for an error."""
    keys, positions = [], Counter()
    for number, row in enumerate(rows):
        benchmark, index = row["benchmark"], row.get("index")
        if index is None:
            keys.append((benchmark, ("position", positions[benchmark])))
            positions[benchmark] += 1
        else:
            keys.append((benchmark, index_key(index, f"{path}:{lines[number] if lines else number + 1}")))
    return keys


def read_scores(path: str) -> list[dict]:
    """Rows of a scores.jsonl: {"benchmark": str, "score": float in [0, 1], "scores": [...], ...}, one per
    problem (``scores``: each sample's score; files without it count ``score`` as one sample), checked: every
    score a number in [0, 1], ``score`` the mean of ``scores`` where both are given, a problem (benchmark, index;
    ``problem_keys``) once, and at least one row."""
    from recipe_apo.integration.jsonl import read_rows

    rows, lines = [], []
    for number, row in read_rows(path, ("benchmark", "score"), "not a scores.jsonl of scripts/evaluate.py",
                                 error=EvaluateError):
        where = f"{path}:{number}"
        if not isinstance(row["benchmark"], str) or not row["benchmark"]:
            raise EvaluateError(f"{where}: benchmark {row['benchmark']!r} is not a benchmark's name")
        if not _score_ok(row["score"]):
            raise EvaluateError(f"{where}: score {_shown(row['score'])} is not a number in [0, 1]")
        scores = row.get("scores")
        if scores is not None:
            if not isinstance(scores, list) or not scores or not all(_score_ok(s) for s in scores):
                raise EvaluateError(f"{where}: scores {str(scores)[:80]} is not a non-empty list of numbers in [0, 1]")
            if abs(sum(scores) / len(scores) - row["score"]) > 1e-9:
                raise EvaluateError(f"{where}: score {row['score']!r} is not the mean of its scores "
                                    f"({sum(scores) / len(scores):.6g}): pass@1 and pass@k would disagree")
        rows.append(row)
        lines.append(number)
    if not rows:
        raise EvaluateError(f"{path}: no scored problem (an empty scores file)")
    check_problems_once(rows, path, lines)
    return rows


def check_problems_once(rows: Sequence[dict], path: str, lines: Optional[Sequence[int]] = None) -> None:
    """EvaluateError naming the second row of a problem (``problem_keys``) given twice; ``lines``: the rows' line
    numbers in ``path`` (else their rows, counted from 1)."""
    seen: dict[tuple, int] = {}
    for number, (row, key) in enumerate(zip(rows, problem_keys(rows, path, lines)), 1):
        at = lines[number - 1] if lines else number
        if key in seen:
            where = f"{path}:{at}" if lines else f"{path}: row {at}"
            raise EvaluateError(f"{where}: {row['benchmark']} problem {_shown(row.get('index'))} is scored twice "
                                f"({'line' if lines else 'row'} {seen[key]} too; indices compare as numbers: 0, 0.0 "
                                "and \"0\" are one problem)")
        seen[key] = at


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s unbiased estimate of pass@k from n samples of which c are right: 1 - C(n-c, k) / C(n, k),
    the chance that k of the n samples drawn without replacement hold a right one (the one function validation
    metrics use too: ``recipe_apo.integration.pass_at_k``)."""
    from recipe_apo.integration.pass_at_k import pass_at_k as unbiased

    return float(unbiased(n, c, k))


def mean_and_se(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """The mean and its standard error, std(values, ddof=1) / sqrt(len(values)); no SE for fewer than 2."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    variance = sum((value - mean) ** 2 for value in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def _sample_scores(row: dict) -> list[float]:
    scores = row.get("scores")
    return [float(s) for s in scores] if isinstance(scores, list) and scores else [float(row["score"])]


def sampling_se(samples: Sequence[Sequence[float]]) -> Optional[float]:
    """The standard error of the mean pass@1 from the sampling alone, the problems held fixed (percent): each
    problem's fraction of k right samples varies by s^2 / k (s^2 its samples' variance, ddof 1), the mean over
    N problems by sqrt(sum s^2 / k) / N. This is the noise of a comparison on the same problems (a run against
    the paper's figure for the benchmark); None when a problem has a single sample (greedy decoding)."""
    if not samples or min(len(s) for s in samples) < 2:
        return None
    total = 0.0
    for scores in samples:
        mean = sum(scores) / len(scores)
        total += sum((score - mean) ** 2 for score in scores) / (len(scores) - 1) / len(scores)
    return 100.0 * math.sqrt(total) / len(samples)


def estimate(rows: Sequence[dict]) -> Estimate:
    """One benchmark's score rows (one per problem) -> mean pass@1 ± its standard error between problems, and
    pass@k at k = the fewest samples any problem has. The SE is over the problems' fractions of right samples:
    it holds both the sampling noise and how problems differ, so it does not vanish as k grows."""
    fractions = [100.0 * float(row["score"]) for row in rows]
    mean, se = mean_and_se(fractions)
    samples = [_sample_scores(row) for row in rows]
    k = min(len(s) for s in samples)
    from recipe_apo.integration.pass_at_k import pass_at_k as unbiased

    # A sample is right when it scores 1 (the reward is 1 for a right answer, 0 otherwise).
    passed = unbiased([len(s) for s in samples], [sum(1 for score in s if score >= 1.0) for s in samples], k)
    return Estimate(mean, se, problems=len(rows), samples=k, pass_at_k=100.0 * float(passed.mean()),
                    sampling_se=sampling_se(samples))


def summarize(rows: Iterable[dict]) -> dict[str, Estimate]:
    """benchmark -> its Estimate, from score rows of several benchmarks."""
    by_benchmark: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_benchmark[str(row["benchmark"])].append(row)
    return {name: estimate(benchmark_rows) for name, benchmark_rows in by_benchmark.items()}


def average(cells: Sequence[Optional[Estimate]]) -> Optional[Estimate]:
    """The unweighted mean of one run's benchmarks; its SE is sqrt(sum SE^2) / count, the benchmarks' problems
    and samples being independent. None when a benchmark is missing."""
    if not cells or any(cell is None for cell in cells):
        return None
    mean = sum(cell.mean for cell in cells) / len(cells)
    sampling = None
    if all(cell.sampling_se is not None for cell in cells):
        sampling = math.sqrt(sum(cell.sampling_se ** 2 for cell in cells)) / len(cells)
    if any(cell.se is None for cell in cells):
        return Estimate(mean, sampling_se=sampling)
    return Estimate(mean, math.sqrt(sum(cell.se ** 2 for cell in cells)) / len(cells), sampling_se=sampling)


def across_runs(estimates: Sequence[Estimate]) -> Estimate:
    """Runs of one method (seeds) pooled: the mean of their means ± the standard error across runs, which holds
    the training's seed-to-seed spread as well as the evaluation's noise."""
    if len(estimates) == 1:
        return estimates[0]
    mean, se = mean_and_se([e.mean for e in estimates])
    k = min(e.samples for e in estimates)
    pass_k = [e.pass_at_k for e in estimates]
    same_k = all(p is not None for p in pass_k) and all(e.samples == k for e in estimates)
    return Estimate(mean, se, problems=min(e.problems for e in estimates), samples=k,
                    pass_at_k=sum(pass_k) / len(pass_k) if same_k else None, runs=len(estimates))


def columns_for(summaries: Iterable[dict[str, Estimate]]) -> tuple[tuple[str, str, Optional[int]], ...]:
    """The table's benchmarks: the paper's five when every scored benchmark is one of them, else every scored
    benchmark in order of first appearance, titled by its name (e.g. scripts/prepare_data.py's reasoning-gym
    levels)."""
    keys = list(dict.fromkeys(key for summary in summaries for key in summary))
    if set(keys) <= {key for key, _, _ in BENCHMARKS}:
        return BENCHMARKS
    return tuple((key, key, None) for key in keys)


def run_row(name: str, summaries: Sequence[dict[str, Estimate]],
            columns: Sequence[tuple[str, str, Optional[int]]] = BENCHMARKS) -> Row:
    """The row of one method: one run's estimates, or several runs' pooled by ``across_runs`` (its average too:
    the SE across the runs' averages, which keeps how a run's benchmarks move together)."""
    per_run = [[summary.get(key) for key, _, _ in columns] for summary in summaries]
    averages = [average(cells) for cells in per_run]
    if len(summaries) == 1:
        return name, per_run[0], averages[0]
    cells = [None if any(run[i] is None for run in per_run) else across_runs([run[i] for run in per_run])
             for i in range(len(columns))]
    total = None if any(a is None for a in averages) else across_runs(averages)
    return f"{name} ({len(summaries)} runs)", cells, total


def critical_value(runs: int) -> float:
    """The 95% two-sided critical value for a gap over its SE: normal for one run (its SE is over 30 problems or
    more), Student's t with runs - 1 degrees of freedom for an SE across a few runs (4.30 for 3 seeds)."""
    if runs <= 1:
        return Z_975
    return _T_975[runs - 2] if runs - 1 <= len(_T_975) else Z_975


def gap_cell(run: Optional[Estimate], paper: float) -> str:
    """run - paper in points. Several runs (seeds): "beyond noise" only when larger than Student's t critical
    value times the SE across runs, which holds the training's seed-to-seed spread (the paper reports no error, so
    its figure is taken as exact). One run: no verdict, only the evaluation's sampling SE on these problems (the
    between-problem SE is shared with the paper's figure, measured on the same problems, and is not noise for this
    comparison; the seed-to-seed spread, the part that matters for one run, is not measured)."""
    if run is None:
        return "-"
    gap = run.mean - paper
    if run.runs > 1 and run.se is not None:
        beyond = abs(gap) > critical_value(run.runs) * run.se
        return f"{gap:+.1f} {'beyond' if beyond else 'within'} noise"
    if run.sampling_se is None:
        return f"{gap:+.1f} (one run, one sample per problem: no SE)"
    return f"{gap:+.1f} (one run; sampling SE {run.sampling_se:.1f})"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, Estimate):
        return f"{value.mean:.1f}" if value.se is None else f"{value.mean:.1f} ± {value.se:.1f}"
    return f"{value:.1f}"


def markdown_text(text: str) -> str:
    """Text as one cell of a markdown table: ``|`` escaped (GitHub's tables never split at ``\\|``), line breaks and
    other control characters as spaces, so a name or a benchmark holding them stays in its own cell of its row."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", text).replace("|", "\\|")


def markdown_table(rows: Sequence[Row], with_average: bool = True,
                   columns: Sequence[tuple[str, str, Optional[int]]] = BENCHMARKS) -> str:
    """The paper's layout: Model | AIME24 | AMC | MATH500 | Minerva | Olympiad Bench | Avg. (or ``columns``)."""
    header = ["Model"] + [title for _, title, _ in columns] + (["Avg."] if with_average else [])
    lines = ["| " + " | ".join(map(markdown_text, header)) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for name, cells, total in rows:
        values = [name] + [_cell(c) for c in cells] + ([_cell(total)] if with_average else [])
        lines.append("| " + " | ".join(map(markdown_text, values)) + " |")
    return "\n".join(lines)


def pass_at_k_table(rows: Sequence[Row],
                    columns: Sequence[tuple[str, str, Optional[int]]] = BENCHMARKS) -> Optional[str]:
    """pass@k of the runs' rows, k = samples per problem (shown in each cell); None when no run sampled twice."""
    def cell(value: Any) -> Any:
        if isinstance(value, Estimate) and value.pass_at_k is not None:
            return f"{value.pass_at_k:.1f} (k={value.samples})"
        return None

    kept = [(name, [cell(c) for c in cells], None) for name, cells, _ in rows
            if any(isinstance(c, Estimate) and c.samples > 1 for c in cells)]
    return markdown_table(kept, with_average=False, columns=columns) if kept else None


def paper_row_for(name: str) -> Optional[tuple[str, tuple[float, ...], float]]:
    """The paper's row a run is named after: "1.5B - APO ..." (its label in any case, alone or followed by
    anything but a letter or digit: "1.5B - GRPO" is not "1.5B - GRPOX") or a run folder of the paper scripts,
    "qwen2.5-math-1.5b-apo-...". None when none is."""
    folder = re.match(r"qwen2\.5-math-(1\.5b|7b)-(grpo|drgrpo|apo)(?![a-z0-9])", name.strip().lower())
    if folder:
        size, method = folder.groups()
        name = f"{size.upper()} - {_PAPER_METHODS[method]}"
    text = " ".join(name.split()).lower()
    for row in PAPER_ROWS:
        label = row[0].removesuffix(" (paper)").lower()
        if text == label or (text.startswith(label) and not text[len(label)].isalnum()):
            return row
    return None


_PAPER_METHODS = {"grpo": "GRPO", "drgrpo": "Dr. GRPO", "apo": "APO"}


def paper_comparison(rows: Sequence[Row]) -> tuple[list[Row], list[str]]:
    """Each run named after a row of the paper: the paper's row, the run's, then the gap; other runs as they are,
    with a warning. The paper's whole table first when no run is named after one of its rows."""
    out: list[Row] = []
    warnings = []
    for name, cells, total in rows:
        paper = paper_row_for(name)
        if paper is None:
            warnings.append(f"{name}: no row of the paper's table to compare with (name it like '1.5B - APO')")
            out.append((name, cells, total))
            continue
        label, figures, paper_average = paper
        out.append((label, list(figures), paper_average))
        out.append((name, cells, total))
        out.append(("gap to the paper", [gap_cell(c, f) for c, f in zip(cells, figures)],
                    gap_cell(total, paper_average)))
    if len(warnings) == len(rows):
        out = [(label, list(figures), paper_average) for label, figures, paper_average in PAPER_ROWS] + out
    return out, warnings


SE_NOTE = ("Mean pass@1 (%) ± its standard error: between problems for one run, across runs for a row of "
           "several runs (seeds).")
GAP_NOTE = ("A gap to the paper of a row of several runs is beyond noise when larger than Student's t(runs - 1) "
            "times the SE across runs (4.30 for 3 runs); the paper's figures, which come without errors, are taken "
            "as exact. One run gets no verdict: its gap comes with the evaluation's sampling SE on these problems, "
            "and the seed-to-seed spread of training, which decides whether one run can tell, is not measured.")


def report(runs: Sequence[tuple[str, Sequence[dict[str, Estimate]]]], paper: bool) -> tuple[str, list[str]]:
    """The markdown report of named runs (each: one summary, or one per seed): the table of mean pass@1 ± SE
    (with the paper's rows and the gaps when ``paper``), then pass@k; and the warnings."""
    columns = columns_for(summary for _, summaries in runs for summary in summaries)
    paper = paper and columns == BENCHMARKS  # the paper's rows only beside the paper's benchmarks
    warnings = [w for name, summaries in runs for summary in summaries for w in count_warnings(name, summary)
                if columns == BENCHMARKS]
    rows = [run_row(name, summaries, columns) for name, summaries in runs]
    pass_table = pass_at_k_table(rows, columns)
    if paper:
        rows, paper_warnings = paper_comparison(rows)
        warnings += paper_warnings
    text = markdown_table(rows, columns=columns) + "\n\n" + SE_NOTE + (" " + GAP_NOTE if paper else "")
    if pass_table:
        text += "\n\npass@k (%), k = samples per problem:\n\n" + pass_table
    return text, warnings


def count_warnings(name: str, summary: dict[str, Estimate]) -> list[str]:
    warnings = []
    for key, title, expected in BENCHMARKS:
        count = summary[key].problems if key in summary else 0
        if count != expected:
            warnings.append(f"{name}: {title} has {count} scored problems, the paper uses {expected}")
    extra = sorted(set(summary) - {key for key, _, _ in BENCHMARKS})
    if extra:
        warnings.append(f"{name}: not in the paper's table, left out: {', '.join(extra)}")
    return warnings


def group_runs(paths: Sequence[str], names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(name, its files), in order of first appearance: files given one --name are one method's runs. A file
    without a --name is a row of its own, named after its folder (after its path where two folders share a name):
    files are pooled as seeds only when named so."""
    if len(names) > len(paths):
        raise EvaluateError(f"{len(names)} --name for {len(paths)} files: give one --name per file")
    unnamed = paths[len(names):]
    defaults = [_default_name(path) for path in unnamed]
    defaults = [d if defaults.count(d) == 1 and d not in names else path for d, path in zip(defaults, unnamed)]
    groups: dict[str, list[str]] = {}
    for path, name in zip(paths, list(names) + defaults):
        groups.setdefault(name, []).append(path)
    return list(groups.items())


# How a scores file was scored (its rows' ``scored_by``): a training run's validation dump, scored there by the
# training reward with its truncation rule (a response cut at the length limit scores 0, conf/truncation/zero.yaml),
# or generations scored here, response by response, with no truncation rule.
VALIDATION, GENERATION = "validation", "generation"


class MixedScoring(EvaluateError):
    """Scores files of both paths in one table."""


def tables_from_files(paths: Sequence[str], names: Sequence[str], paper: bool) -> tuple[str, list[str]]:
    """The report of score files; files of the validation path and of the generation path are never pooled in
    one table: the two score one checkpoint differently (validation gives a truncated answer 0, generation
    scores it as it reads), so their figures differ by the share of truncated right answers."""
    seen: dict[tuple, str] = {}
    for path in paths:
        identity = file_identity(path)
        if identity in seen:
            first = seen[identity]
            also = "" if first == path else f" (as {path}: a link, or another path to it)"
            raise EvaluateError(f"{first} is given twice{also}: one file is one run (a seed counted twice would "
                                "shrink the SE across runs)")
        seen[identity] = path
    files = {path: read_scores(path) for path in paths}
    origins = {path: {row.get("scored_by", GENERATION) for row in rows} for path, rows in files.items()}
    validation = [p for p, o in origins.items() if VALIDATION in o]
    generation = [p for p, o in origins.items() if GENERATION in o]
    if validation and generation:
        raise MixedScoring(
            f"{validation[0]} was scored from a validation dump and {generation[0]} from generations: one table "
            "takes one of the two (validation scores a truncated answer 0, generation as it reads); tabulate "
            "them apart")
    groups = group_runs(paths, names)
    copies = []
    for name, group in groups:
        problems = {path: set(problem_keys(files[path], path)) for path in group}
        first = group[0]
        for number, path in enumerate(group[1:], 1):
            if problems[path] != problems[first]:
                raise EvaluateError(f"{path} and {first}, both --name {name!r}, score different problems "
                                    f"({_problem_counts(files[path])} against {_problem_counts(files[first])}): "
                                    "seeds of one method must be scored on the same problems to be pooled")
            same = next((other for other in group[:number] if files[other] == files[path]), None)
            if same is not None:
                copies.append(f"{name}: {path} holds the same scores as {same}, line for line: a copy of one run? "
                              "Pooled as two seeds, it shrinks the SE across runs")
    runs = [(name, [summarize(files[path]) for path in group]) for name, group in groups]
    table, warnings = report(runs, paper)
    return table, copies + warnings


def file_identity(path: str) -> tuple:
    """What makes two paths one file: its device and inode (a hard link, a symbolic link or another spelling of
    the path is the same file); a path that cannot be read is kept as its resolved self (read_scores names it)."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return ("path", os.path.realpath(path) if "\0" not in path else path)
    return ("file", status.st_dev, status.st_ino)


def _problem_counts(rows: Sequence[dict]) -> str:
    """"AMC 83, AIME24 30": a file's problems per benchmark, as an error shows them."""
    counts = Counter(str(row["benchmark"]) for row in rows)
    return ", ".join(f"{benchmark} {count}" for benchmark, count in counts.items())


# --------------------------------------------------------------------------------------------------------------
# Which samples per problem can give the paper's figures
# --------------------------------------------------------------------------------------------------------------


def attainable(figure: float, problems: int, samples: int) -> bool:
    """Whether mean pass@1 over ``problems`` problems with ``samples`` samples each can print as ``figure`` (in
    percent, one decimal). It is 100 m / (problems x samples) for a count m of right samples, so some m must
    land within 0.05 of the figure (inclusive: either way of rounding a half). Exact, in integers:
    |100 m / T - t / 10| <= 1/20 with T = problems x samples and t the figure in tenths is
    |2000 m - 2 t T| <= T."""
    total = problems * samples
    tenths = round(figure * 10)
    lowest = -((total - 2 * tenths * total) // 2000)  # ceil((2 t T - T) / 2000)
    highest = (2 * tenths * total + total) // 2000
    return max(lowest, 0) <= min(highest, total)


def paper_figures(key: str) -> list[float]:
    """The paper's six figures of one benchmark."""
    column = [key for key, _, _ in BENCHMARKS].index(key)
    return [figures[column] for _, figures, _ in PAPER_ROWS]


def every_figure_from(problems: int) -> int:
    """The k from which on every one-decimal figure is attainable: steps of 100 / (problems x k) <= 0.1 point
    always land in a figure's window of 0.1, i.e. problems x k >= 1,000."""
    return -(-1000 // problems)


def attaining_samples(key: str, problems: int) -> list[int]:
    """Every k up to ``every_figure_from(problems)`` (all larger k attain everything too) at which all the paper's
    figures of a benchmark are attainable."""
    return [k for k in range(1, every_figure_from(problems) + 1)
            if all(attainable(f, problems, k) for f in paper_figures(key))]


def _ranges(values: Sequence[int], open_end: int) -> str:
    """[23, 28, 29, 31, 32, 33, 34], 34 -> "23, 28, 29, 31 and up" (the run reaching ``open_end`` goes on)."""
    parts, start = [], None
    for i, value in enumerate(values):
        start = value if start is None else start
        if i + 1 == len(values) or values[i + 1] != value + 1:
            parts.append(f"{start} and up" if value == open_end else str(start) if value == start else
                         f"{start}, {value}" if value == start + 1 else f"{start}-{value}")
            start = None
    return ", ".join(parts)


def attainability_table() -> str:
    """Per benchmark: the paper's figures greedy decoding (k = 1) cannot give, every k that gives all six, and
    the default k with the responses it takes."""
    lines = ["| Benchmark | Problems | Not attainable at k = 1 | k attaining all six | Default k | Responses |",
             "|---|---:|---|---|---:|---:|"]
    for key, title, problems in BENCHMARKS:
        missed = [f"{f:.1f}" for f in paper_figures(key) if not attainable(f, problems, 1)]
        lines.append(f"| {title} | {problems} | {', '.join(missed) or '-'} | "
                     f"{_ranges(attaining_samples(key, problems), every_figure_from(problems))} | "
                     f"{DEFAULT_SAMPLES[key]} | {problems * DEFAULT_SAMPLES[key]:,} |")
    # One k for all five, as verl's validation samples: a k every benchmark attains.
    bound = max(every_figure_from(problems) for _, _, problems in BENCHMARKS)
    common = [k for k in range(1, bound + 1) if all(
        k >= every_figure_from(problems) or k in attaining_samples(key, problems) for key, _, problems in BENCHMARKS)]
    total = sum(problems * DEFAULT_SAMPLES[key] for key, _, problems in BENCHMARKS)
    greedy = sum(problems for _, _, problems in BENCHMARKS)
    lines.append(f"| all five | {greedy:,} | | {_ranges(common, bound)} (one k for all) | | {total:,} |")
    return "\n".join(lines)


def model_label(model: str) -> str:
    """``<experiment>-global_step_N`` for a verl checkpoint (``global_step_N`` alone repeats across runs), else
    the model's last path component."""
    parts = [p for p in model.rstrip("/").split("/") if p]
    if parts and parts[-1] == "actor":
        parts = parts[:-1]
    if len(parts) >= 2 and parts[-1].startswith("global_step_"):
        return f"{parts[-2]}-{parts[-1]}"
    return parts[-1] if parts else model


def _default_name(path: str) -> str:
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return folder or os.path.basename(path)


# --------------------------------------------------------------------------------------------------------------
# Scoring (CPU)
# --------------------------------------------------------------------------------------------------------------


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _as_dict(value: Any) -> dict:
    if isinstance(value, dict):
        return {key: (v.tolist() if hasattr(v, "tolist") and not isinstance(v, (str, bytes)) else v)
                for key, v in value.items()}
    return {}


ScoreMany = Callable[..., list[float]]  # (items, timeout=...) -> scores, as recipe_apo.reward.score_many


def reward_scorer(path: str = DEFAULT_REWARD_PATH, name: str = DEFAULT_REWARD_NAME) -> ScoreMany:
    """The training reward's ``score_many`` (worker processes, timeouts), or a reward function given the way
    verl's ``reward.custom_reward_function`` gives one (a file path or ``pkg://module``, and a name), called
    in order, as verl calls it."""
    if (path, name) == (DEFAULT_REWARD_PATH, DEFAULT_REWARD_NAME):
        from recipe_apo.reward import score_many

        return score_many
    from verl.utils.import_utils import load_extern_object

    compute_score = load_extern_object(path, name)

    def score_one(source, response, truth, extra_info) -> Any:
        result = compute_score(data_source=source, solution_str=response, ground_truth=truth, extra_info=extra_info)
        if isinstance(result, dict):  # verl takes {"score": ...} too
            result = result.get("score", result)
        if isinstance(result, bool):  # verl's reward tensor reads True as 1.0
            return float(result)
        if hasattr(result, "item") and getattr(result, "ndim", None) == 0:  # a numpy or torch scalar
            result = result.item()
        return result  # score_generations checks it

    def score_many_custom(items: list, timeout: float) -> list[float]:
        # timeout bounds the recipe's reward only: its workers enforce it; a plain function cannot be stopped.
        return [score_one(*item) for item in items]

    return score_many_custom


def score_generations(path: str, out_path: str, timeout: float, score_many: Optional[ScoreMany] = None) -> list[dict]:
    """Score ``responses`` of a generations parquet with the training reward (or ``score_many``, e.g.
    ``reward_scorer(...)``); write scores.jsonl."""

    from recipe_apo.reward import gym_answer, last_boxed_answer

    score_many = score_many or reward_scorer()

    frame = _read_parquet(path)
    missing = {"data_source", "reward_model", "responses"} - set(frame.columns)
    if missing:
        raise EvaluateError(f"{path}: missing columns {sorted(missing)} (expected main_generation_server's output)")
    items, owners = [], []
    for row_index, row in enumerate(frame.itertuples(index=False)):
        reward_model = _as_dict(row.reward_model)
        extra_info = _as_dict(getattr(row, "extra_info", None))
        responses = _as_list(row.responses)
        if not responses:
            raise EvaluateError(f"{path}: row {row_index + 1} ({_shown(row.data_source)} problem "
                                f"{_shown(extra_info.get('index', row_index))}) has no responses: no pass@1 to give it")
        for number, response in enumerate(responses):
            text = response if isinstance(response, str) else ""
            items.append((row.data_source, text, reward_model.get("ground_truth"),
                          extra_info))
            owners.append((row_index, number))

    def check(start: int, scores: Sequence[Any]) -> None:
        for (row_index, number), item, score in zip(owners[start:], items[start:], scores):
            if not _score_ok(score):
                raise EvaluateError(f"{path}: row {row_index + 1} ({_shown(item[0])}), response {number + 1}: "
                                    f"the reward gave {_shown(score)}, not a number in [0, 1] (--reward-path/"
                                    "--reward-name: mean pass@1 needs 1 for a right answer, 0 for a wrong one)")

    scores = _score_with_progress(items, timeout, score_many, check)
    per_row: dict[int, list[float]] = defaultdict(list)
    for (owner, _), score in zip(owners, scores):
        per_row[owner].append(float(score))
    results = []
    for row_index, row in enumerate(frame.itertuples(index=False)):
        reward_model = _as_dict(row.reward_model)
        extra_info = _as_dict(getattr(row, "extra_info", None))
        responses = _as_list(row.responses)
        row_scores = per_row.get(row_index, [])
        results.append(
            {
                "benchmark": row.data_source,
                "index": extra_info.get("index", row_index),
                "ground_truth": reward_model.get("ground_truth"),
                # What the training reward reads as the answer: the last number of a reasoning-gym row, else the box.
                "answers": [(gym_answer.last_number(r) if gym_answer.is_gym_row(extra_info) else last_boxed_answer(r))
                            if isinstance(r, str) else None for r in responses],
                "scores": row_scores,
                "score": sum(row_scores) / len(row_scores) if row_scores else 0.0,
                "response_chars": [len(r) if isinstance(r, str) else 0 for r in responses],
                "scored_by": GENERATION,
            }
        )
    check_problems_once(results, path)  # what --table would refuse in the file, refused before it is written
    write_scores(results, out_path)
    return results


def _score_with_progress(items: list, timeout: float, score_many,
                         check: Callable[[int, Sequence[Any]], None] = lambda start, scores: None) -> list[float]:
    """``score_many`` over ``items`` in chunks, each chunk's scores handed to ``check(start, scores)`` as it comes
    (a reward giving impossible scores stops at its first chunk, not after all of them)."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    scores: list[float] = []
    chunk = 256
    with (tqdm(total=len(items), desc="scoring", unit="response", file=sys.stderr, disable=None) if tqdm else
          contextlib.nullcontext()) as bar:
        for start in range(0, len(items), chunk):
            part = list(score_many(items[start : start + chunk], timeout=timeout))
            if len(part) != len(items[start : start + chunk]):
                raise EvaluateError(f"the reward gave {len(part)} scores for {len(items[start : start + chunk])} "
                                    "responses (--reward-path/--reward-name)")
            check(start, part)
            scores.extend(part)
            if bar is not None:
                bar.update(len(part))
    return scores


# --------------------------------------------------------------------------------------------------------------
# Merge and generation (GPU machine)
# --------------------------------------------------------------------------------------------------------------


def find_actor_checkpoint(path: str) -> Optional[str]:
    """The FSDP actor folder of a verl checkpoint (``global_step_N`` or its ``actor/``), or None."""
    for candidate in (path, os.path.join(path, "actor")):
        if os.path.isfile(os.path.join(candidate, "fsdp_config.json")) or glob.glob(
            os.path.join(candidate, "model_world_size_*_rank_0.pt")
        ):
            return candidate
    return None


def merge_command(python: str, actor_dir: str, target_dir: str) -> list[str]:
    return [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", actor_dir,
            "--target_dir", target_dir]


def generation_command(python: str, model: str, data_files: Sequence[str], output: str,
                       args: argparse.Namespace, samples: int) -> list[str]:
    """verl's generation server answering every prompt of ``data_files`` ``samples`` times at ``args``'s
    temperature and top-p (already resolved: 0 for greedy)."""
    files = "[" + ",".join(data_files) + "]"
    return [
        python, "-m", "verl.trainer.main_generation_server",
        f"data.train_files={files}",
        "data.prompt_key=prompt",
        f"+data.output_path={output}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.max_response_length}",  # the rollout's response_length follows it
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        # verl's default, dummy, expects a trainer to sync weights in; a standalone server never gets them.
        "actor_rollout_ref.rollout.load_format=auto",
        f"actor_rollout_ref.rollout.temperature={args.temperature}",
        f"actor_rollout_ref.rollout.top_p={args.top_p}",
        f"actor_rollout_ref.rollout.n={samples}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        # The OpenAI-style server applies the chat template itself: it needs the tokenizer.
        "actor_rollout_ref.rollout.skip_tokenizer_init=false",
        f"trainer.n_gpus_per_node={args.ngpus}",
        "trainer.nnodes=1",
    ] + list(args.generation_override)


def sample_groups(samples: dict[str, int]) -> list[tuple[int, list[str]]]:
    """(k, benchmarks sampled k times) in order of first appearance: verl's server takes one n per run."""
    groups: dict[int, list[str]] = {}
    for name, k in samples.items():
        groups.setdefault(k, []).append(name)
    return list(groups.items())


def join_generations(parts: Sequence[str], output: str) -> None:
    """The generation runs' parquet files as one, in order (each row: a problem and its list of responses)."""
    import pandas as pd

    pd.concat([pd.read_parquet(part) for part in parts], ignore_index=True).to_parquet(output)


def run(command: list[str], dry_run: bool, env: Optional[dict] = None) -> None:
    print("+ " + " ".join(shlex.quote(part) for part in command), file=sys.stderr, flush=True)
    if not dry_run:
        subprocess.run(command, check=True, env=env)


def generation_machine(args: argparse.Namespace) -> Optional[dict]:
    """On a machine without a GPU, the CPU's generation settings join ``args.generation_override`` (the user's
    own come after them, so they win) and their environment is returned; on a GPU machine, None. Sets
    ``args.ngpus`` when it was not given: every GPU, or one CPU replica."""
    from recipe_apo.cpu import generation

    if generation.has_gpu():
        if args.ngpus is None:
            import torch

            args.ngpus = torch.cuda.device_count()
        return None
    args.ngpus = args.ngpus or 1
    overrides, env = generation.cpu_generation(args.ngpus)
    print(f"[2/3] no GPU here: generating on the CPU with the {generation.engine()} rollout "
          f"(recipe_apo/cpu/generation.py)", file=sys.stderr)
    given = {_override_key(item) for item in args.generation_override}
    # A key the user sets is theirs alone: Hydra refuses a "+key" given twice.
    args.generation_override = [*(o for o in overrides if _override_key(o) not in given), *args.generation_override]
    return env


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def benchmark_files(data_dir: str, names: Sequence[str]) -> list[str]:
    files = [os.path.join(os.path.expanduser(data_dir), f"{name}.parquet") for name in names]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise EvaluateError(f"missing {', '.join(missing)}: run scripts/prepare_data.py --out-dir {data_dir} "
                            "(or give --data-dir)")
    return files


def _read_parquet(path: str) -> Any:
    """A parquet file as a frame; one ``EvaluateError`` line for a file pandas cannot read."""
    import pandas as pd

    if not os.path.isfile(path):
        raise EvaluateError(f"{path}: {'a folder, not a file' if os.path.isdir(path) else 'no such file'}")
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several kinds for a truncated or foreign file
        raise EvaluateError(f"{path}: not a readable parquet file ({type(exc).__name__})") from None


# --------------------------------------------------------------------------------------------------------------
# A training run's validation dump (CPU)
# --------------------------------------------------------------------------------------------------------------


def scores_from_validation(dump: str, data_dir: str, names: Sequence[str]) -> list[dict]:
    """Score rows, one per problem, from a validation dump of a training run (``trainer.validation_data_dir``,
    ``<step>.jsonl``: one line per response, scored by the training reward). verl's dump names no benchmark:
    it holds the prompts of ``data.val_files`` in order (verl's ``data.validation_shuffle`` is false), each
    repeated ``val_kwargs.n`` times, so the problems come from the prepared files of ``names`` in that order,
    and every response's ground truth must be its problem's."""

    from recipe_apo.integration.jsonl import read_rows

    hint = "not a validation dump of verl (trainer.validation_data_dir)"
    responses = []
    for number, row in read_rows(dump, ("input", "gts", "score"), hint, error=EvaluateError):
        if not _score_ok(row["score"]):
            raise EvaluateError(f"{dump}:{number}: score {_shown(row['score'])} is not a number in [0, 1] (mean "
                                "pass@1 counts right answers: a reward on another scale cannot be tabulated)")
        responses.append(row)
    problems = []
    for name, path in zip(names, benchmark_files(data_dir, names)):
        for position, row in enumerate(_read_parquet(path).itertuples(index=False)):
            index = _as_dict(getattr(row, "extra_info", None)).get("index", position)
            problems.append((name, index, _as_dict(row.reward_model).get("ground_truth")))
    if not problems or not responses or len(responses) % len(problems):
        raise EvaluateError(f"{dump}: {len(responses)} responses are not the same number for each of the "
                         f"{len(problems)} problems of {', '.join(names)} (data.val_files in another order, or "
                         "other benchmarks? --benchmarks names them in data.val_files' order)")
    k = len(responses) // len(problems)
    rows = []
    for number, (name, index, truth) in enumerate(problems):
        block = responses[number * k:(number + 1) * k]
        if any(r["input"] != block[0]["input"] or str(r["gts"]) != str(truth) for r in block):
            raise EvaluateError(f"{dump}: responses {number * k + 1}-{(number + 1) * k} are not the {k} samples of "
                             f"{name} problem {index} (ground truth {truth!r}): validated in another order than "
                             f"--benchmarks {','.join(names)}?")
        scores = [float(r["score"]) for r in block]  # checked in [0, 1] above
        rows.append({"benchmark": name, "index": index, "ground_truth": truth, "scores": scores,
                     "score": sum(scores) / k, "scored_by": VALIDATION})
    check_problems_once(rows, f"{dump} (problems of {', '.join(names)} in {data_dir})")
    return rows


def validation_label(dump: str) -> str:
    """``<experiment>-validation_<step>`` for ``.../<experiment>/validation/<step>.jsonl``."""
    path = os.path.abspath(dump)
    step = os.path.splitext(os.path.basename(path))[0]
    experiment = os.path.basename(os.path.dirname(os.path.dirname(path)))
    return f"{experiment}-validation_{step}" if experiment else f"validation_{step}"


def write_scores(rows: Sequence[dict], out_path: str) -> None:
    write_text(out_path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def write_text(path: str, text: str) -> None:
    """``text`` as the file ``path`` (its folder made): written beside it, then moved over it, so a link there is
    replaced, not written through, and a stopped run leaves the old file whole. EvaluateError for a path that
    cannot be written (a folder in the way, no permission)."""
    import tempfile

    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)  # as open() would make it (mkstemp's is private)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        raise EvaluateError(f"{path}: cannot be written ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--model", help="Hugging Face model (id or folder) or verl checkpoint (global_step_N[/actor])")
    mode.add_argument("--score", metavar="GENERATIONS", help="score an existing generations parquet (CPU)")
    mode.add_argument("--table", nargs="+", metavar="SCORES",
                      help="tabulate scores.jsonl files, one row each; files given the same --name are one "
                           "method's runs (seeds), one row: mean across runs ± SE across runs (CPU)")
    mode.add_argument("--validation", metavar="DUMP",
                      help="tabulate a training run's validation dump, <checkpoint folder>/validation/<step>.jsonl "
                           "(its prompts in --benchmarks order, as the paper scripts' data.val_files) (CPU)")
    mode.add_argument("--attainability", action="store_true",
                      help="print which samples per problem can give every figure of the paper's table")
    parser.add_argument("--name", action="append", default=[],
                        help="row name in the table (repeat for several --table files; the same name for runs "
                             "of one method over seeds); named like a row of the paper ('1.5B - APO') for --paper")
    parser.add_argument("--out-dir", default=None,
                        help="default: eval/<the row name: --name, or the model's, checkpoint's or dump's>, spaces "
                             "as _ (a name with other characters than letters, digits and ._+- gets _ for them and a "
                             "hash of the name: a name is never a path)")
    parser.add_argument("--data-dir", default="~/data/recipe_apo", help="where prepare_data.py wrote the benchmarks")
    parser.add_argument("--benchmarks", default=",".join(key for key, _, _ in BENCHMARKS),
                        help="the prepared files (<data-dir>/<name>.parquet) to evaluate, comma-separated; for "
                             "--validation in the run's data.val_files order")
    parser.add_argument("--ngpus", type=int, default=None,
                        help="generation replicas' GPUs (default: every GPU torch sees; on a machine without one, "
                             "1 CPU replica)")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size of each vLLM replica")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--max-prompt-length", type=int, default=1024)
    parser.add_argument("--max-response-length", type=int, default=3000, help="the paper's (and Dr. GRPO's) cap")
    defaults = ",".join(f"{key}={k}" for key, k in DEFAULT_SAMPLES.items())
    parser.add_argument("--n", default=None, metavar="K or BENCHMARK=K,...",
                        help=f"samples per problem, for every benchmark (K) or some (the rest keep theirs); "
                             f"default {defaults} ({OTHER_SAMPLES} for others): every figure of the paper's "
                             f"table attainable (--attainability)")
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"sampling temperature, default {DEFAULT_TEMPERATURE} (the policy's own "
                             "distribution, as in training); 0: greedy, one sample")
    parser.add_argument("--top-p", type=float, default=None, help=f"nucleus sampling, in (0, 1]; default "
                                                                  f"{DEFAULT_TOP_P}")
    parser.add_argument("--greedy", action="store_true",
                        help="one greedy answer per problem (temperature 0), as Dr. GRPO evaluates")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per answer check")
    parser.add_argument("--reward-path", default=DEFAULT_REWARD_PATH,
                        help="reward function's file or pkg://module, as verl's reward.custom_reward_function.path")
    parser.add_argument("--reward-name", default=DEFAULT_REWARD_NAME, help="the reward function's name there")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs verl")
    parser.add_argument("--generation-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override for main_generation_server")
    parser.add_argument("--paper", action="store_true",
                        help="put the paper's row above each run named after one (--name) and the gap below it: "
                             "across seeds marked beyond noise past the 95%% critical value times the SE across "
                             "runs; one run with its sampling SE and no verdict")
    parser.add_argument("--dry-run", action="store_true", help="print the merge and generation commands only")
    return parser


def samples_per_benchmark(spec: Optional[str], names: Sequence[str]) -> dict[str, int]:
    """--n: K for every benchmark, or BENCHMARK=K,... for some (the rest keep their defaults). ValueError names
    what is wrong."""
    samples = {name: DEFAULT_SAMPLES.get(name, OTHER_SAMPLES) for name in names}
    if spec is None:
        return samples
    if "=" not in spec:
        return {name: _count(spec) for name in names}
    for part in spec.split(","):
        name, _, value = part.partition("=")
        if name.strip() not in samples:
            raise ValueError(f"{name.strip()!r} is not one of --benchmarks ({', '.join(names)})")
        samples[name.strip()] = _count(value)
    return samples


def _count(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a whole number of samples") from None
    if k < 1:
        raise ValueError(f"samples per problem must be 1 or more, got {k}")
    return k


def resolve_sampling(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     names: Sequence[str]) -> dict[str, int]:
    """Check --n, --temperature, --top-p and --greedy (parser.error names a bad one); set args.temperature and
    args.top_p to what generation uses; return the samples per problem of each benchmark."""
    if args.temperature is not None and args.temperature < 0:
        parser.error(f"--temperature must be 0 (greedy) or more, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        parser.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.greedy and args.temperature:
        parser.error(f"--greedy decodes at temperature 0, got --temperature {args.temperature}")
    try:
        samples = samples_per_benchmark(args.n, names)
    except ValueError as exc:
        parser.error(f"--n: {exc}")
    if args.greedy or args.temperature == 0:
        if args.n is not None and max(samples.values()) > 1:
            parser.error("--n > 1 needs sampling: greedy decoding (--greedy or --temperature 0) gives "
                         "identical answers")
        args.temperature, args.top_p = 0.0, 1.0
        return {name: 1 for name in names}
    args.temperature = DEFAULT_TEMPERATURE if args.temperature is None else args.temperature
    args.top_p = DEFAULT_TOP_P if args.top_p is None else args.top_p
    return samples


def generate(args: argparse.Namespace, model: str, out_dir: str, samples: dict[str, int]) -> str:
    """Run verl's generation server once per distinct samples-per-problem; the generations parquet's path."""
    generations = os.path.join(os.path.abspath(out_dir), "generations.parquet")
    env = generation_machine(args)
    groups = sample_groups(samples)
    parts = []
    for k, names in groups:
        files = benchmark_files(args.data_dir, names) if not args.dry_run else [
            os.path.join(os.path.expanduser(args.data_dir), f"{n}.parquet") for n in names]
        part = generations if len(groups) == 1 else os.path.join(os.path.abspath(out_dir), f"generations.n{k}.parquet")
        print(f"[2/3] generating {k} response(s) per problem of {', '.join(names)} with verl's generation server "
              f"on {args.ngpus} replica(s) -> {part}", file=sys.stderr)
        run(generation_command(args.python, model, files, part, args, k), args.dry_run, env)
        parts.append(part)
    if len(groups) > 1 and not args.dry_run:
        join_generations(parts, generations)
    return generations


def finish(runs_rows: Sequence[dict], name: str, out_dir: str, scores_path: str, paper: bool) -> int:
    """Print (and write to results.md) the report of one scored run."""
    table, warnings = report([(name, [summarize(runs_rows)])], paper)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    write_text(os.path.join(out_dir, "results.md"), table + "\n")
    print(f"scores: {scores_path}\ntable: {os.path.join(out_dir, 'results.md')}", file=sys.stderr)
    print(table)
    return 0


def check_names(names: Sequence[str], mode: str) -> None:
    """--name: each a one-line row name that is not blank, one of them outside --table (EvaluateError names the
    first that is not)."""
    if len(names) > 1 and mode != "table":
        raise EvaluateError(f"--name is given {len(names)} times: --{mode} makes one row (several --name are for "
                            "--table, one per file)")
    for name in names:
        if not name.strip():
            raise EvaluateError(f"--name {name!r} is blank: a row of the table needs a name")
        if re.search(r"[\x00-\x1f\x7f]", name):
            raise EvaluateError(f"--name {name!r} holds a control character (a line break?): a row name is one line")


def out_folder(name: str) -> str:
    """The default --out-dir of a row name: ``eval/<name>``, spaces as underscores ("1.5B - APO":
    ``eval/1.5B_-_APO``). A name is never a path: one holding anything but letters, digits, ``.``, ``_``, ``+``
    and ``-`` (a ``/``, a non-ASCII letter), or longer than 100 characters, becomes those characters and a hash
    of the name (``eval/a_b-<8 hex digits>`` for "a/b"), so two names never share a folder; a name of dots
    alone (``.``, ``..``), which would be a folder already there, is refused (EvaluateError)."""
    import hashlib

    folder = name.replace(" ", "_")
    if not re.fullmatch(r"[A-Za-z0-9._+-]{1,100}", folder):
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        folder = f"{re.sub(r'[^A-Za-z0-9._+-]', '_', name)[:80].lstrip('.')}-{digest}"  # not hidden
    if not folder.strip("."):
        raise EvaluateError(f"the row name {name!r} (--name, or the model's or dump's own) makes no folder of its "
                            "own under eval/ ('.' and '..' are folders already there): give --out-dir or another "
                            "--name")
    return os.path.join("eval", folder)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command; a file or setting it cannot use is one line on stderr, ``evaluate.py: error: ...``, exit 2."""
    try:
        return _main(argv)
    except EvaluateError as exc:
        print(f"evaluate.py: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


def _main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [part.strip() for part in args.benchmarks.split(",") if part.strip()]

    if args.attainability:
        print(attainability_table())
        return 0
    check_names(args.name, "table" if args.table else "validation" if args.validation else
                "score" if args.score else "model")
    if args.table:
        table, warnings = tables_from_files(args.table, args.name, args.paper)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(table)
        return 0
    if args.validation:
        name = args.name[0] if args.name else validation_label(args.validation)
        out_dir = args.out_dir or out_folder(name)
        rows = scores_from_validation(args.validation, args.data_dir, names)
        scores_path = os.path.join(out_dir, "scores.jsonl")
        write_scores(rows, scores_path)
        return finish(rows, name, out_dir, scores_path, args.paper)

    samples = resolve_sampling(parser, args, names) if args.model else {}
    # Loaded first: a wrong --reward-path should fail before the generation's GPU hours, not after.
    score_many = None if args.dry_run else reward_scorer(args.reward_path, args.reward_name)

    if args.score:
        generations = args.score
        out_dir = args.out_dir or os.path.dirname(os.path.abspath(generations))
        name = args.name[0] if args.name else _default_name(generations)
    else:
        model = args.model.rstrip("/")
        name = args.name[0] if args.name else model_label(model)
        out_dir = args.out_dir or out_folder(name)
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise EvaluateError(f"--out-dir {out_dir}: cannot be made a folder ({exc.strerror or exc})") from None
        actor_dir = find_actor_checkpoint(model) if os.path.isdir(model) else None
        if actor_dir is not None:
            merged = os.path.join(out_dir, "hf_model")
            if os.path.isfile(os.path.join(merged, "config.json")):
                print(f"[1/3] merged model already in {merged}", file=sys.stderr)
            else:
                print(f"[1/3] merging the FSDP checkpoint {actor_dir} into {merged}", file=sys.stderr)
                run(merge_command(args.python, actor_dir, merged), args.dry_run)
            model = os.path.abspath(merged)
        else:
            print(f"[1/3] {model}: a Hugging Face model, nothing to merge", file=sys.stderr)
        generations = generate(args, model, out_dir, samples)
        if args.dry_run:
            return 0

    print(f"[3/3] scoring {generations}", file=sys.stderr)
    scores_path = os.path.join(out_dir, "scores.jsonl")
    results = score_generations(generations, scores_path, args.timeout, score_many)
    return finish(results, name, out_dir, scores_path, args.paper)


if __name__ == "__main__":
    sys.exit(main())
