"""A league's report: ``league.json`` (per scenario, each method's row, ranked, and the matrix of paired
differences), ``league.md`` and ``league.png``, from the scenarios' ``summary.json`` (``report.summary``). The
league's run (``recipe_apo.testbed.league``) hands them over; every column of a method's own comes from its
declaration (``recipe_apo.methods.base.Metric``: ``trust``, ``league``, ``final``, ``peak``; headed by its words).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from recipe_apo.testbed.report.markdown import task_text
from recipe_apo.testbed.report.stats import paired_between

# What a league writes in its folder, beside a folder per scenario (the league's run clears them before a new one).
LEAGUE_FILES = ("league.md", "league.json", "league.png")

# Columns of a scenario's table beside the ranking metric: (summary key, header, format).
COLUMNS = [
    ("success_avg", "success, mean over training", "{:.3f}"),
    ("hard_success_avg", "hardest third, mean over training", "{:.3f}"),
    ("live_share_avg", "live share", "{:.2f}"),
]
# The table of the generation and the trust region per scenario: (summary key, header, format).
TRUST_COLUMNS = [
    ("tokens_generated_avg", "tokens generated / round (with any probe)", "{:.0f}"),
    ("probe_tokens_avg", "of which probe", "{:.0f}"),
    ("ratio_out_share_avg", "r outside [0.8, 1.2]", "{:.3f}"),
    ("clipfrac_avg", "clipped (pg_clipfrac)", "{:.3f}"),
]


def declared_column(name: str, declared: Any) -> tuple[str, str, str]:
    """(summary key, header, format) of a metric a method declares (``recipe_apo.methods.base.Metric``), headed
    with its words: its largest value (``peak``: ``<name>_max``, the largest over the scenario's runs, see
    ``scenario_table``), its last round's (``final``), or its mean over the rounds."""
    if declared.peak:
        return f"{name}_max", f"{name}: {declared.words}; largest of any round of any seed", "{:.3f}"
    if declared.final:
        return f"{name}_final", f"{name}: {declared.words}, last round", "{:.4f}"
    return f"{name}_avg", f"{name}: {declared.words}", "{:.3f}"


def trust_columns() -> list[tuple[str, str, str]]:
    """``TRUST_COLUMNS`` and the methods' trust metrics (``Metric.trust``; ``declared_column``)."""
    from recipe_apo.methods import catalog

    return TRUST_COLUMNS + [declared_column(name, m) for name, m in catalog.trust_metrics().items()]


def own_columns() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Per method (its title, in catalog order) the columns of its league metrics (``Metric.league``;
    ``declared_column``); methods without one are left out."""
    from recipe_apo.methods import catalog

    league = catalog.league_metrics()
    out = []
    for method in catalog.methods():
        names = [method.metric(q) for q in method.metrics] + list(method.loss_metrics)
        columns = [declared_column(name, league[name]) for name in names if name in league]
        if columns:
            out.append((method.title, columns))
    return out


HEADERS = {
    "success_final": "final success",
    "success_avg": "success, mean over training",
    "success_early": "success, early",
    "hard_success_avg": "hardest third, mean over training",
    "hard_success_final": "hardest third, final",
}


def _rank(labels: list[str], means: dict[str, float]) -> dict[str, int]:
    """Competition ranking by mean, highest first (equal means share a rank; NaN last)."""
    key = {label: means[label] if math.isfinite(means[label]) else -math.inf for label in labels}
    return {label: 1 + sum(key[other] > key[label] for other in labels) for label in labels}


def scenario_table(summary: dict[str, Any], metric: str) -> dict[str, Any]:
    """One scenario's rows (ranked) and its pairwise matrix of paired differences ``a - b`` on ``metric``; each
    row's ``metric`` holds its mean, std, se and ``per_seed``, the values the paired differences are taken from."""
    labels = list(summary["methods"])
    n = len(summary["seeds"])
    agg = summary["aggregate"]

    def stat(label: str, key: str) -> dict[str, float] | None:
        if key not in agg[label]:
            return None
        mean, std = agg[label][key]["mean"], agg[label][key]["std"]
        return {"mean": mean, "std": std, "se": std / math.sqrt(n) if math.isfinite(std) else float("nan")}

    matrix = {a: {b: paired_between(summary, a, b, metric) for b in labels if b != a} for a in labels}
    # Each method's metric per seed (in the order of ``summary["seeds"]``) beside its mean: what a reader
    # recomputes the table and every verdict from (scripts/league_verdicts.py); a league.json written before has
    # the matrix's differences only.
    per_seed = {label: [float(summary["runs"][label][str(s)][metric]) for s in summary["seeds"]] for label in labels}
    ranks = _rank(labels, {label: agg[label][metric]["mean"] for label in labels})
    rows = []
    for label in sorted(labels, key=lambda name: (ranks[name], labels.index(name))):
        cells = matrix[label]
        row = {
            "method": label,
            "rank": ranks[label],
            metric: {**stat(label, metric), "per_seed": per_seed[label]},
            "wins": [b for b in labels if b != label and cells[b]["beyond_seed_noise"] and cells[b]["mean"] > 0],
            "losses": [b for b in labels if b != label and cells[b]["beyond_seed_noise"] and cells[b]["mean"] < 0],
        }
        own = [key for _, columns in own_columns() for key, _, _ in columns]
        for key in dict.fromkeys([c[0] for c in COLUMNS] + own + [c[0] for c in trust_columns()]):
            if key == metric or key not in agg[label]:
                continue
            # A largest value (``<name>_max``): the largest of all the seeds' runs, not a mean over seeds.
            row[key] = (max(run[key] for run in summary["runs"][label].values()) if key.endswith("_max")
                        else stat(label, key))
        rows.append(row)
    return {"rows": rows, "matrix": matrix}


def build_league(
    summaries: dict[str, dict[str, Any]],
    scenarios: dict[str, list[str]],
    metric: str,
    families: dict[str, str] | None = None,
) -> dict[str, Any]:
    """league.json: per scenario its rows and matrix (``scenario_table``); ``families``: label -> the league
    method it is a variant of (the plot colours by it)."""
    out: dict[str, Any] = {"metric": metric, "scenarios": {}}
    for name, summary in summaries.items():
        cfg = summary["config"]
        out["scenarios"][name] = {
            "overrides": scenarios[name],
            "scenario_name": summary["scenario"],
            "seeds": summary["seeds"],
            "rounds": cfg["rounds"],
            "ppo_epochs": cfg["actor_rollout_ref"]["actor"]["ppo_epochs"],
            "task": task_text(cfg),
            "staleness": cfg.get("staleness", 0),
            "methods": summary["methods"],
            "wall_s": summary["wall_s"],
            "report": f"{name}/report.md",
            **scenario_table(summary, metric),
        }
    out["labels"] = list(next(iter(summaries.values()))["methods"])
    out["families"] = families or {label: label for label in out["labels"]}
    return out


def _cell(stat: dict[str, float] | None, fmt: str) -> str:
    if stat is None or not math.isfinite(stat["mean"]):
        return "-"
    if not math.isfinite(stat["se"]):
        return f"{fmt.format(stat['mean'])} (one seed)"
    return f"{fmt.format(stat['mean'])} +- {fmt.format(stat['se'])}"


def _difference(p: dict[str, Any]) -> str:
    if not math.isfinite(p["mean"]):
        return "nan"
    text = f"{p['mean']:+.3f}"
    agree = f"{p['seeds_agree']}/{p['seeds']}"
    return f"**{text}** {agree}" if p["beyond_seed_noise"] else f"{text} {agree}"


def league_markdown(league: dict[str, Any]) -> str:
    """league.md: the introduction, the overview of ranks per scenario, then one section per scenario."""
    lines = _introduction(league) + _overview(league)
    for name, s in league["scenarios"].items():
        lines += _scenario_section(name, s, league["metric"])
    lines += ["", "Plot: `league.png` (paired difference to the first method, per scenario).", ""]
    return "\n".join(lines)


def _introduction(league: dict[str, Any]) -> list[str]:
    header = HEADERS.get(league["metric"], league["metric"])
    labels, scenarios = league["labels"], league["scenarios"]
    seeds = next(iter(scenarios.values()))["seeds"]
    return [
        f"# CPU testbed league: {len(labels)} methods x {len(scenarios)} scenario{'s' if len(scenarios) > 1 else ''}, "
        f"{len(seeds)} seeds",
        "",
        f"Ranked by {header} (mean over seeds; +- is the standard error over seeds, std / sqrt({len(seeds)})). "
        "Every pair of methods is compared on the same seeds (same start, same prompts, same evaluation set): "
        "*beats* / *trails* list the methods a method is ahead of / behind **beyond seed noise**, i.e. every seed "
        "agrees on the sign and a paired t-test clears 5% (the testbed's rule; with fewer than 3 seeds nothing "
        "is). Ranks by the mean alone do not say more than that. "
        + "".join(f"`<method>_{suffix}`: the method with {' '.join(f'`{o}`' for o in extra)}. "
                  for suffix, extra in league.get("variants", {}).items()
                  if any(label.endswith(f"_{suffix}") for label in labels))
        + "".join(f"`{name}`: {' '.join(f'`{o}`' for o in extra)}. " for name, extra in league.get("extra", {}).items()
                  if name in labels)
        + ("`rollout_n_multiplier=2`: twice the scenario's responses per prompt (`actor_rollout_ref.rollout.n`), the "
           "generation of a probe as large as the training responses, plus those. "
           if any("rollout_n_multiplier=2" in extra for name, extra in league.get("extra", {}).items()
                  if name in labels) else "")
        + "".join(f"`{name}` is left out (the recipe's launch refuses it {why}). "
                  for name, why in league.get("left_out", {}).items())
        + f"Wall time: {league.get('wall_s', float('nan')):.0f} s.",
    ]


def _overview(league: dict[str, Any]) -> list[str]:
    """Per method and scenario: rank, (wins-losses) beyond seed noise, the metric."""
    scenarios = league["scenarios"]
    lines = [
        "",
        "## Overview: rank (wins-losses beyond seed noise) per scenario",
        "",
        "| method | " + " | ".join(scenarios) + " |",
        "|---|" + "---|" * len(scenarios),
    ]
    for label in league["labels"]:
        cells = []
        for s in scenarios.values():
            row = next(r for r in s["rows"] if r["method"] == label)
            cells.append(f"{row['rank']} ({len(row['wins'])}-{len(row['losses'])}), "
                         f"{_cell(row[league['metric']], '{:.3f}')}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _scenario_section(name: str, s: dict[str, Any], metric: str) -> list[str]:
    """One scenario: its setting, the ranked table, the generation and trust region, each method at work (its
    declared league metrics), the pairwise matrix."""
    header = HEADERS.get(metric, metric)
    overrides = " ".join(f"`{o}`" for o in s["overrides"]) or "(defaults)"
    lines = [
        "",
        f"## {name}: {overrides}",
        "",
        f"{s['rounds']} rounds, ppo_epochs={s['ppo_epochs']}, {s['task']}, "
        + (f"responses from the policy of {s['staleness']} rounds before, " if s.get("staleness") else "")
        + f"{len(s['seeds'])} seeds; the scenario's own report: `{s['report']}`.",
        "",
        f"| rank | method | {header} | " + " | ".join(h for _, h, _ in COLUMNS) + " | beats | trails |",
        "|---|---|---|" + "---|" * len(COLUMNS) + "---|---|",
    ]
    for row in s["rows"]:
        cells = [_cell(row.get(key), fmt) for key, _, fmt in COLUMNS]
        lines.append(
            f"| {row['rank']} | {row['method']} | {_cell(row[metric], '{:.3f}')} | " + " | ".join(cells)
            + f" | {', '.join(row['wins']) or '-'} | {', '.join(row['losses']) or '-'} |"
        )
    return lines + _trust_table(s["rows"]) + _own_tables(s["rows"]) + _matrix(s, header)


def _trust_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per method, what a round generates and how its trust region acted (means over the rounds, +- SE over
    seeds): the columns some method of the scenario has (a method's own, ``Metric.trust``, only where a method of the
    scenario logs it; a summary without the generation keys, none of this table)."""
    columns = [c for c in trust_columns() if any(c[0] in row for row in rows)]
    if not any(key == "tokens_generated_avg" for key, _, _ in columns):
        return []
    lines = [
        "",
        "Generation and trust region (means over the rounds; +- SE over seeds; `-`: not the method's). Tokens count "
        "each response up to its end token, any probe's included; r = pi / pi_old when a token's loss was taken.",
        "",
        "| method | " + " | ".join(h for _, h, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in rows:
        lines.append(f"| {row['method']} | " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns) + " |")
    return lines


def _cell_or_value(value: dict[str, float] | float | None, fmt: str) -> str:
    """A row's cell: a statistic over seeds (``_cell``), or one number (a largest value)."""
    if isinstance(value, (int, float)):
        return fmt.format(value) if math.isfinite(value) else "-"
    return _cell(value, fmt)


def _own_tables(rows: list[dict[str, Any]]) -> list[str]:
    """Per method that declares league metrics (``Metric.league``) and that some method of the scenario logs: a table
    of them, for the rows that have them (none: no lines)."""
    lines = []
    for title, columns in own_columns():
        mine = [row for row in rows if any(key in row for key, _, _ in columns)]
        if not mine:
            continue
        lines += [
            "",
            f"{title[:1].upper() + title[1:]} at work (its declared metrics: means over the rounds, +- SE over "
            "seeds; a largest value: over every round of every seed):",
            "",
            "| method | " + " | ".join(h for _, h, _ in columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        for row in mine:
            lines.append(f"| {row['method']} | "
                         + " | ".join(_cell_or_value(row.get(key), fmt) for key, _, fmt in columns) + " |")
    return lines


def _matrix(s: dict[str, Any], header: str) -> list[str]:
    """The scenario's paired differences, row minus column, in rank order."""
    order = [row["method"] for row in s["rows"]]
    lines = [
        "",
        f"Paired difference in {header}, row minus column (ordered by rank), and the seeds on the majority "
        "side; **bold**: beyond seed noise.",
        "",
        "| row - column | " + " | ".join(order) + " |",
        "|---|" + "---|" * len(order),
    ]
    for a in order:
        lines.append(f"| {a} | " + " | ".join("." if a == b else _difference(s["matrix"][a][b]) for b in order)
                     + " |")
    return lines


def write_league(league: dict[str, Any], out_dir: Path, plot: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "league.json").write_text(json.dumps(league, indent=1, allow_nan=True))
    (out_dir / "league.md").write_text(league_markdown(league))
    if plot:
        from recipe_apo.testbed.report.plots import plot_league

        plot_league(league, out_dir / "league.png")
