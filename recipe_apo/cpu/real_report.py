"""The real-model study's report (``make real``): every figure from one JSON file, so that every verdict can be
recomputed.

``write(...)`` gathers the study's figures into ``real_cpu.json`` (per seed and per problem), then renders
``real_cpu.md`` and ``real_cpu.png`` from that file alone; ``python -m recipe_apo.cpu.real_report
results/real_cpu.json`` renders them again from it (no run, no model needed).

Figures:

- held-out pass@1: the mean over the test part's problems of each problem's share of right samples
  (``scripts/evaluate.py``'s scores), per level and over all problems;
- the gain over the base model, paired by problem: the mean over problems of (trained - base) and its standard
  error (the standard deviation of the differences over the square root of the number of problems);
- a method against another: paired by seed (the same data order), the mean over seeds of the difference in
  held-out pass@1, its SE across seeds, and Student's t with seeds - 1 degrees of freedom; and paired by problem,
  each problem's difference averaged over the seeds, its SE across problems and Student's t with problems - 1
  degrees of freedom (the evaluation's own noise: a finite problem set, a few samples each). "beyond noise" when
  both |t| exceed their two-sided 95% critical values; "within the evaluation's noise" when the seeds agree but
  the problems do not resolve the difference (three seeds can agree on a difference far smaller than one
  evaluation can measure, and their 2 degrees of freedom then give a tiny SE); else "within noise";
- the validation curve: verl's ``val-core/<level>/acc/mean@k`` at each validation step (the validation part,
  disjoint from the test part).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

# Two-sided 95% critical values of Student's t, degrees of freedom 1-10.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
ALL = "all"
# What the held-out figures were measured on: the study's test part, or (--quick) the validation part.
HELD_OUT = {
    "test": "Held-out: the test part (never trained or validated on), scored by scripts/evaluate.py at temperature 1 "
            "(a cut-off answer is scored as written), pass@1 in percent.",
    "validation": "Held-out: the validation part (never trained on) as verl's validation scored it before the first "
                  "step and after the last, at temperature 1 with the training reward (a cut-off answer scores 0), "
                  "pass@1 in percent.",
}


# ---- reading what the runs left --------------------------------------------------------------------------------
def read_scores(path: Path) -> dict[str, dict[str, float]]:
    """``{level: {"<level>/<index>": share of right samples}}`` of a scores.jsonl of scripts/evaluate.py: each row
    its own problem (a question in two levels' files was sampled for each)."""
    table: dict[str, dict[str, float]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            table.setdefault(row["benchmark"], {})[f"{row['benchmark']}/{row['index']}"] = float(row["score"])
    return table


def read_validation(dump: Path, val_dir: Path, levels: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{level: {question: share of right samples}}`` of a validation dump (verl's
    ``trainer.validation_data_dir/<step>.jsonl``, one line per sample, in no set order, naming no level). A sample's
    problem is its question; a question in two levels' validation files (``a + b`` is in both levels) cannot be told
    apart in the dump: its samples are pooled, and it counts once in each of its levels and once over all. The
    scores are the training reward's, the truncation rule included."""
    import pandas as pd

    where: dict[str, list[str]] = {}
    for level in levels:
        frame = pd.read_parquet(Path(val_dir) / f"{level}.parquet")
        for prompt in frame["prompt"]:
            where.setdefault(prompt[-1]["content"], []).append(level)
    samples: dict[str, list[float]] = {}
    for number, line in enumerate(Path(dump).read_text().splitlines(), 1):
        row = json.loads(line)
        question = row["input"].rsplit("user\n", 1)[-1].removesuffix("\n").rsplit("\nassistant", 1)[0].strip()
        if question not in where:
            raise ValueError(f"{dump}:{number}: a question not in {val_dir}: {question[:60]!r}")
        samples.setdefault(question, []).append(float(row["score"]))
    table: dict[str, dict[str, float]] = {level: {} for level in levels}
    for question, scores in sorted(samples.items()):
        for level in where[question]:
            table[level][question] = statistics.fmean(scores)
    return {level: rows for level, rows in table.items() if rows}


def read_runs(metrics_root: Path, project: str, runs: dict) -> dict:
    """Each run's logged steps from verl's file logger, every attempt merged (a resumed step's last row wins):
    ``{(method, seed): [ {step, ...metrics}, ... ]}``."""
    merged = {}
    for key, experiment in runs.items():
        steps: dict[int, dict] = {}
        for path in sorted(Path(metrics_root).glob(f"*/{project}/{experiment}.jsonl")):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                steps.setdefault(int(record["step"]), {}).update(record["data"])
        merged[key] = [{"step": step, **steps[step]} for step in sorted(steps)]
    return merged


def curve(rows: Sequence[dict], levels: Sequence[str]) -> list[dict]:
    """The validation points: ``[{"step": n, level: acc, ...}]``."""
    points = []
    for row in rows:
        values = {}
        for level in levels:
            found = [v for k, v in row.items() if k.startswith(f"val-core/{level}/acc/mean@")]
            if found:
                values[level] = float(found[0])
        if values:
            points.append({"step": row["step"], **values})
    return points


def training(rows: Sequence[dict]) -> list[dict]:
    keys = {"score": "critic/score/mean", "length": "response_length/mean", "clipped": "response_length/clip_ratio",
            "seconds": "timing_s/step", "gen_s": "timing_s/gen", "update_s": "timing_s/update_actor"}
    return [{"step": row["step"], **{name: float(row[key]) for name, key in keys.items() if key in row}}
            for row in rows if "training/global_step" in row]


# ---- statistics ---------------------------------------------------------------------------------------------------
def mean_se(values: Sequence[float]) -> tuple[float, Optional[float]]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def problems(scores: dict[str, dict[str, float]], level: str) -> dict[str, float]:
    """One level's problems, or (``ALL``) every level's, a problem that two levels share counted once."""
    if level != ALL:
        return scores[level]
    merged: dict[str, float] = {}
    for table in scores.values():
        merged.update(table)
    return merged


def pass_at_1(scores: dict[str, dict[str, float]], level: str) -> float:
    return statistics.fmean(problems(scores, level).values())


def paired_gap(trained: dict, base: dict, level: str) -> tuple[float, Optional[float], int]:
    """Mean and SE over problems of trained - base, and the number of problems (both must hold the same ones)."""
    mine, theirs = problems(trained, level) if level == ALL or level in trained else {}, problems(base, level)
    if set(mine) != set(theirs):
        raise ValueError(f"{level}: the trained and base evaluations scored different problems")
    diffs = [mine[key] - theirs[key] for key in theirs]
    mean, se = mean_se(diffs)
    return mean, se, len(diffs)


def t_critical(dof: int) -> float:
    """The two-sided 95% critical value of Student's t: the table to 10 degrees of freedom, above it the
    Cornish-Fisher expansion to 1/dof^3 around the normal's 1.95996 (within 2e-4 of the exact value from 11 on)."""
    if dof <= len(T_975):
        return T_975[dof - 1]
    z = 1.959964
    return (z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * dof ** 3))


def problem_test(a_scores: Sequence[dict], b_scores: Sequence[dict], level: str) -> dict:
    """Paired by problem, pooled over seeds: each problem's b - a averaged over the seeds (``a_scores[i]`` and
    ``b_scores[i]`` are one seed's runs), then the mean, SE and t over problems (problems - 1 degrees of freedom)."""
    tables = [(problems(a, level), problems(b, level)) for a, b in zip(a_scores, b_scores)]
    keys = set(tables[0][0])
    if any(set(a) != keys or set(b) != keys for a, b in tables):
        raise ValueError(f"{level}: the runs compared scored different problems")
    per_problem = [statistics.fmean(b[key] - a[key] for a, b in tables) for key in sorted(keys, key=str)]
    mean, se = mean_se(per_problem)
    if se is None or se == 0:
        return {"problem_se": se, "problem_t": None, "problem_critical": None, "problems": len(per_problem)}
    return {"problem_se": se, "problem_t": mean / se, "problem_critical": t_critical(len(per_problem) - 1),
            "problems": len(per_problem)}


def seed_test(differences: Sequence[float]) -> dict:
    """Paired test across seeds of per-seed differences."""
    mean, se = mean_se(differences)
    n = len(differences)
    if se is None or se == 0:
        return {"mean": mean, "se": se, "t": None, "critical": None, "seeds": n,
                "verdict": "one seed: no verdict" if n < 2 else "no spread"}
    t = mean / se
    critical = T_975[min(n - 1, len(T_975)) - 1]
    return {"mean": mean, "se": se, "t": t, "critical": critical, "seeds": n,
            "verdict": "beyond noise" if abs(t) > critical else "within noise"}


# ---- the figures --------------------------------------------------------------------------------------------------
def figures(base, trained: dict, metrics: dict, levels: Sequence[str]) -> dict:
    """The study's JSON (without provenance): base and per-run held-out scores per problem, gaps, curves. ``base``
    and ``trained``'s values are scores.jsonl paths of scripts/evaluate.py or tables already read."""
    def read(scores) -> dict:
        return scores if isinstance(scores, dict) else read_scores(scores)

    base_scores = read(base)
    result = {"levels": list(levels), "base": {"scores": base_scores,
                                               "pass1": {lv: pass_at_1(base_scores, lv) for lv in [*levels, ALL]}},
              "runs": []}
    for (method, seed), path in trained.items():
        scores = read(path)
        result["runs"].append({
            "method": method, "seed": seed, "scores": scores,
            "curve": curve(metrics.get((method, seed), []), levels),
            "training": training(metrics.get((method, seed), [])),
        })
    return result


# Baselines first, so that a verdict reads "apo - grpo".
ORDER = ("grpo", "drgrpo", "apo")


def _method_order(method: str) -> tuple[int, str]:
    return (ORDER.index(method) if method in ORDER else len(ORDER), method)


def derive(study: dict) -> dict:
    """Everything the report states, from the JSON's per-problem scores alone."""
    levels = [*study["levels"], ALL]
    base = study["base"]["scores"]
    rows = []
    for run in study["runs"]:
        row = {"method": run["method"], "seed": run["seed"], "pass1": {}, "gap": {}}
        for level in levels:
            row["pass1"][level] = pass_at_1(run["scores"], level)
            mean, se, n = paired_gap(run["scores"], base, level)
            row["gap"][level] = {"mean": mean, "se": se, "problems": n,
                                 "beyond_3se": bool(se and mean > 3 * se)}
        rows.append(row)
    scores = {(run["method"], run["seed"]): run["scores"] for run in study["runs"]}
    methods = sorted(dict.fromkeys(r["method"] for r in rows), key=_method_order)
    per_method = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        per_method[method] = {level: dict(zip(("mean", "se"), mean_se([r["pass1"][level] for r in mine])))
                              for level in levels}
        per_method[method]["seeds"] = sorted(r["seed"] for r in mine)
    pairs = []
    for i, a in enumerate(methods):
        for b in methods[i + 1:]:
            seeds = sorted({r["seed"] for r in rows if r["method"] == a}
                           & {r["seed"] for r in rows if r["method"] == b})
            if not seeds:
                continue
            by = {(r["method"], r["seed"]): r for r in rows}
            for level in levels:
                test = seed_test([by[(b, s)]["pass1"][level] - by[(a, s)]["pass1"][level] for s in seeds])
                test.update(problem_test([scores[(a, s)] for s in seeds], [scores[(b, s)] for s in seeds], level))
                if test["verdict"] == "beyond noise" and not (
                        test["problem_t"] is not None and abs(test["problem_t"]) > test["problem_critical"]):
                    test["verdict"] = "within the evaluation's noise"
                pairs.append({"a": a, "b": b, "level": level, **test})
    return {"runs": rows, "methods": per_method, "pairs": pairs}


# ---- rendering ----------------------------------------------------------------------------------------------------
def _pct(value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def markdown(study: dict, derived: dict, plot: Optional[str], audit: Optional[str]) -> str:
    levels = [*study["levels"], ALL]
    prov, settings = study.get("provenance", {}), study.get("settings", {})
    lines = ["# A real model through the recipe on a CPU: SmolLM2-135M-Instruct on reasoning-gym arithmetic", "",
             f"Made by `{prov.get('command', '?')}` at commit `{prov.get('commit', '?')[:12]}`"
             f"{' (with uncommitted changes)' if prov.get('dirty') else ''} on `{prov.get('host', '?')}` "
             f"({prov.get('cores', '?')} cores, {prov.get('date', '?')}). Every figure below is recomputed from "
             f"`real_cpu.json` by `python -m recipe_apo.cpu.real_report real_cpu.json`.", "",
             f"Training: {settings.get('steps', '?')} steps of 8 prompts x 8 samples, verl's "
             f"{settings.get('engine', '?')} rollout. {HELD_OUT[settings.get('held_out', 'test')]}", "",
             "## Held-out pass@1, and the gain over the base model (paired by problem)", "",
             "| run | " + " | ".join(levels) + " | gain (all) +- SE | > 3 SE |", "|---|" + "---:|" * (len(levels) + 2)]
    lines.append("| base model | " + " | ".join(_pct(study["base"]["pass1"][lv]) for lv in levels) + " | - | - |")
    for row in derived["runs"]:
        gap = row["gap"][ALL]
        lines.append(f"| {row['method']} seed {row['seed']} | " + " | ".join(_pct(row["pass1"][lv]) for lv in levels)
                     + f" | {_pct(gap['mean'], True)} +- {_pct(gap['se'])} | {'yes' if gap['beyond_3se'] else 'no'} |")
    lines += ["", "## Methods over seeds (mean +- SE across seeds)", "",
              "| method | seeds | " + " | ".join(levels) + " |", "|---|---|" + "---:|" * len(levels)]
    for method, figs in derived["methods"].items():
        cells = [f"{_pct(figs[lv]['mean'])} +- {_pct(figs[lv]['se'])}" for lv in levels]
        lines.append(f"| {method} | {', '.join(map(str, figs['seeds']))} | " + " | ".join(cells) + " |")
    if derived["pairs"]:
        lines += ["", "## Verdicts: two-sided t-tests at 95%, paired by seed and paired by problem", "",
                  "Beyond noise when both tests resolve the difference: the seeds (SE across seeds) and the "
                  "evaluation (each problem's difference averaged over the seeds, SE across problems).", "",
                  "| comparison | level | mean difference | SE (seeds) | t | critical | SE (problems) | t | critical "
                  "| verdict |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]

        def num(value: Optional[float], digits: int) -> str:
            return "-" if value is None else f"{value:.{digits}f}"

        for pair in derived["pairs"]:
            verdict = f"**{pair['verdict']}**" if pair["verdict"] == "beyond noise" else pair["verdict"]
            lines.append(f"| {pair['b']} - {pair['a']} | {pair['level']} | {_pct(pair['mean'], True)} | "
                         f"{_pct(pair['se'])} | {num(pair['t'], 2)} | {num(pair['critical'], 3)} | "
                         f"{_pct(pair.get('problem_se'))} | {num(pair.get('problem_t'), 2)} | "
                         f"{num(pair.get('problem_critical'), 3)} | {verdict} |")
    lines += ["", "## Time per step (seconds, mean over each run's steps after the first)", "",
              "| run | step | generation | update |", "|---|---:|---:|---:|"]
    for run in study["runs"]:
        steady = run["training"][1:] or run["training"]
        if steady:
            cells = [statistics.fmean(r[k] for r in steady if k in r) if any(k in r for r in steady) else None
                     for k in ("seconds", "gen_s", "update_s")]
            lines.append(f"| {run['method']} seed {run['seed']} | " +
                         " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    if plot:
        lines += ["", f"![validation pass@1 against step]({plot})"]
    if audit:
        report = Path(audit)
        if report.is_absolute():  # an older report's record: the path on the machine that made it
            lines += ["", f"The bias audit of every run's rollouts: `{audit}`."]
        else:
            lines += ["", f"The bias audit of the runs' rollouts (the four biases, per run): [{audit}]({audit}).", "",
                      f"![the bias audit]({report.parent.as_posix()}/audit.png)"]
    return "\n".join(lines) + "\n"


def plot(study: dict, path: Path) -> Optional[Path]:
    """Validation pass@1 against step, one panel per level, one colour per method (thin: seeds; thick: their mean)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = study["levels"]
    fig, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 3.6), squeeze=False)
    methods = sorted(dict.fromkeys(run["method"] for run in study["runs"]), key=_method_order)
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    for ax, level in zip(axes[0], levels):
        ax.axhline(100 * study["base"]["pass1"][level], color="grey", ls=":", label="base (test part)")
        for method in methods:
            points: dict[int, list[float]] = {}
            for run in (r for r in study["runs"] if r["method"] == method):
                xs = [p["step"] for p in run["curve"] if level in p]
                ys = [100 * p[level] for p in run["curve"] if level in p]
                ax.plot(xs, ys, color=colours[method], alpha=0.3, lw=0.8)
                for x, y in zip(xs, ys):
                    points.setdefault(x, []).append(y)
            xs = sorted(points)
            ax.plot(xs, [statistics.fmean(points[x]) for x in xs], color=colours[method], lw=2, label=method)
        ax.set_title(level)
        ax.set_xlabel("step")
        ax.set_ylabel("validation pass@1 (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(json_path: Path) -> Path:
    """real_cpu.md and real_cpu.png beside ``json_path``, from it alone."""
    json_path = Path(json_path)
    study = json.loads(json_path.read_text())
    derived = derive(study)
    png = plot(study, json_path.with_suffix(".png"))
    md = json_path.with_suffix(".md")
    md.write_text(markdown(study, derived, png.name if png else None, study.get("audit")))
    return md


def carried(path: Path, settings: dict) -> Optional[dict]:
    """An earlier report's study (``path``), when it was made with the same ``settings``: its base scores and runs
    stand for what a new session would otherwise train and evaluate again (a session ends whatever still runs; a
    report's JSON is what it leaves). None when there is none, it cannot be read, or its settings differ."""
    try:
        study = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(study, dict) or study.get("settings") != settings:
        return None
    return study


def write(results: Path, base, trained: dict, metrics: dict, audit: Optional[Path], levels: Sequence[str],
          provenance: dict, settings: dict, name: str = "real_cpu", earlier: Optional[dict] = None) -> Path:
    """The report of the base scores and ``trained`` runs (with each new run's ``provenance``), and of ``earlier``'s
    runs that this call did not train (each keeps its own provenance)."""
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    if audit and Path(audit).resolve().is_relative_to(results.resolve()):  # a link the committed report can follow
        audit = Path(audit).resolve().relative_to(results.resolve())
    study = {"provenance": provenance, "settings": settings, **figures(base, trained, metrics, levels),
             "audit": Path(audit).as_posix() if audit else None}
    for run in study["runs"]:
        run["provenance"] = provenance
    if earlier:
        new = {(run["method"], run["seed"]) for run in study["runs"]}
        study["runs"] += [run for run in earlier["runs"] if (run["method"], run["seed"]) not in new]
    path = results / f"{name}.json"
    path.write_text(json.dumps(study, indent=1, sort_keys=True) + "\n")
    return render(path)


def main(argv: Optional[Iterable[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m recipe_apo.cpu.real_report REAL_CPU.json", file=sys.stderr)
        return 2
    print(render(Path(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
