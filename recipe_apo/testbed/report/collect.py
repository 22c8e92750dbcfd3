"""The jobs of a testbed sweep in one table, ``collected.md`` and ``collected.json``, from their ``summary.json``
(``python -m recipe_apo.testbed.collect <multirun dir>``, or at the end of a ``-m`` sweep: the callback there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recipe_apo.testbed.report.markdown import mean_and_spread
from recipe_apo.testbed.report.stats import paired

COLUMNS = [
    ("success_avg", "success, mean over training", "{:.3f}"),
    ("hard_success_avg", "hardest third, mean", "{:.3f}"),
    ("success_final", "success, final", "{:.3f}"),
    ("len_incorrect", "len. incorrect", "{:.1f}"),
    ("cut_share", "cut at L0", "{:.3f}"),
]


def _job_overrides(job_dir: Path) -> list[str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.exists():
        return [job_dir.name]
    return [line[2:].strip() for line in path.read_text().splitlines() if line.startswith("- ")]


def _cell(fmt: str, stat: dict[str, float]) -> str:
    return mean_and_spread(fmt, stat["mean"], stat["std"])


def _job_order(job: Path, root: Path) -> tuple:
    """Hydra's job folders in numeric order (0, 1, 2, ..., 10), not as text (0, 1, 10, 2)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in job.relative_to(root).parts)


def collect(sweep_dir: Path) -> str:
    """Write ``collected.md`` and ``collected.json`` in ``sweep_dir``; return the markdown."""
    sweep_dir = Path(sweep_dir)
    jobs = sorted((p.parent for p in sweep_dir.rglob("summary.json")), key=lambda job: _job_order(job, sweep_dir))
    if not jobs:
        raise FileNotFoundError(f"no summary.json under {sweep_dir}: is it a testbed multirun folder?")
    rows: list[dict[str, Any]] = []
    overrides_of = {job: _job_overrides(job) for job in jobs}
    # Overrides every job shares say nothing about the difference between rows: stated once above the table.
    shared = [o for o in overrides_of[jobs[0]] if all(o in overrides_of[j] for j in jobs)] if len(jobs) > 1 else []
    lines = [
        f"# Testbed sweep: {sweep_dir}",
        "",
        f"Every job: {' '.join(shared) if shared else '(no shared overrides)'}.",
        "",
        "Mean +- std over seeds per job and method. *vs others*: paired difference in mean success over training "
        "against each other method of the same job (same seeds, same starts), with the seeds that agree; "
        "bold when every seed agrees and a paired t-test clears 5%.",
        "",
        "| job overrides | method | " + " | ".join(h for _, h, _ in COLUMNS) + " | vs others (success, mean) |",
        "|---|---|" + "---|" * len(COLUMNS) + "---|",
    ]
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        overrides = " ".join(o for o in overrides_of[job] if o not in shared) or "(defaults)"
        for label, stats in summary["aggregate"].items():
            versus = []
            for name, metrics in summary["paired"].items():
                a, b = name.split(" - ")
                if label not in (a, b):
                    continue
                p = metrics["success_avg"]
                sign = 1.0 if a == label else -1.0
                other = b if a == label else a
                text = f"{sign * p['mean']:+.3f} vs {other} ({p['seeds_agree']}/{p['seeds']})"
                versus.append(f"**{text}**" if p["beyond_seed_noise"] else text)
            cells = [_cell(fmt, stats[key]) for key, _, fmt in COLUMNS]
            lines.append(f"| {overrides} | {label} | " + " | ".join(cells) + " | " + "; ".join(versus) + " |")
            rows.append({"job": str(job), "overrides": overrides, "method": label,
                         **{key: stats[key] for key, _, _ in COLUMNS}})
    lines += across_jobs([(" ".join(o for o in overrides_of[job] if o not in shared) or "(defaults)",
                           json.loads((job / "summary.json").read_text())) for job in jobs])
    text = "\n".join(lines) + "\n"
    (sweep_dir / "collected.md").write_text(text)
    (sweep_dir / "collected.json").write_text(json.dumps(rows, indent=1))
    return text


def across_jobs(jobs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The same method in each job against the first job, paired by seed: the single run's seed-noise verdict.

    Pairs are valid only where the jobs share each seed's start (same initial weights, the swept key being a
    method setting); otherwise the row says so instead of comparing.
    """
    if len(jobs) < 2:
        return []
    (base_name, base), rest = jobs[0], jobs[1:]
    lines = ["", f"## Across jobs: each method against itself in the first job ({base_name})", "",
             "Paired by seed, mean success over training; **bold** when every seed agrees and a paired t-test "
             "clears 5% (as in a single run's report), else within seed noise.", "",
             "| method | job | per seed | mean | agree | verdict |", "|---|---|---|---|---|---|"]
    for name, summary in rest:
        seeds = [str(s) for s in base["seeds"]]
        same_start = summary["seeds"] == base["seeds"] and all(
            summary["seed_setup"][s]["init_weights_sha256"] == base["seed_setup"][s]["init_weights_sha256"]
            for s in seeds)
        for label in summary["runs"]:
            if label not in base["runs"]:
                continue
            if not same_start:
                lines.append(f"| {label} | {name} | - | - | - | not paired: the jobs start from different weights |")
                continue
            p = paired([summary["runs"][label][s]["success_avg"] for s in seeds],
                       [base["runs"][label][s]["success_avg"] for s in seeds])
            verdict = f"**{p['direction']}**" if p["beyond_seed_noise"] else "within seed noise"
            per_seed = " ".join(f"{d:+.3f}" for d in p["per_seed"])
            lines.append(f"| {label} | {name} | {per_seed} | {p['mean']:+.3f} | {p['seeds_agree']}/{p['seeds']} | "
                         f"{verdict} |")
    return lines
