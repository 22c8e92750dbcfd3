"""``python -m recipe_apo.testbed mode=league``: every method of ``league`` on every scenario of it, paired over
the seeds, ranked against every other method per scenario.

The methods are ``league.methods`` (labels of ``methods``) and ``league.extra`` (the league's own), each as it is
and with its ``league.variants`` (by default ``<method>_zv``: ``algorithm.zero_variance=exclude``, for the
methods ``league.variant_of`` names). Each scenario is one ordinary testbed
run (its own folder with report.md, summary.json and plots); the league reads their paired statistics
(``report.paired``, the testbed's verdict rule: beyond seed noise when every seed agrees on the sign and a
paired t-test clears 5%) and writes ``league.md``, ``league.json`` and ``league.png`` beside them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from recipe_apo.errors import RecipeError
from recipe_apo.testbed.configs import _key, compose_testbed, league_entries, method_configs
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.report import RUN_FILES, paired_between, task_text
from recipe_apo.testbed.runner import check_method, run_testbed
from recipe_apo.testbed.setting_check import LaunchRefusal, check_settings, text

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


def trust_columns() -> list[tuple[str, str, str]]:
    """``TRUST_COLUMNS`` and the methods' trust metrics (``Metric.trust``), headed with their declared words: the
    mean over the rounds, or the last round's value of a value the method carries (``Metric.final``)."""
    from recipe_apo.methods import catalog

    return TRUST_COLUMNS + [(f"{name}_final", f"{name}: {m.words}, last round", "{:.4f}") if m.final else
                            (f"{name}_avg", f"{name}: {m.words}", "{:.3f}")
                            for name, m in catalog.trust_metrics().items()]
HEADERS = {
    "success_final": "final success",
    "success_avg": "success, mean over training",
    "success_early": "success, early",
    "hard_success_avg": "hardest third, mean over training",
    "hard_success_final": "hardest third, final",
}


@dataclass
class LeaguePlan:
    """A league composed and checked, before any training: its methods (label -> overrides), its scenarios (name
    -> overrides), per scenario every method's checked config, and the methods left out (label -> why: the
    scenario and the recipe launch's line)."""

    base: DictConfig
    metric: str
    entries: dict[str, list[str]]
    scenarios: dict[str, list[str]]
    cfgs: dict[str, dict[str, DictConfig]]
    left_out: dict[str, str] = field(default_factory=dict)


def plan_league(overrides: list[str]) -> LeaguePlan:
    """Compose and check every method on every scenario: a bad setting, method or scenario fails here, in
    seconds, not after the scenarios before it have trained.

    A method that the recipe's launch refuses on a scenario but not on its own overrides (R2PO on the stale ones:
    ``configs.method_configs``) is left out of every scenario, so that each compares the same methods, said in
    one line on stderr now and in league.md; a method refused on its own, or a scenario left without a method, is
    refused."""
    for override in overrides:
        if _key(override) in ("method", "scenario"):
            raise TestbedSettingError(
                f"{override}: mode=league runs league.methods on league.scenarios; drop {override} from the command "
                "line (e.g. league.methods=[grpo,codapo] or 'league.scenarios=[[],[\"task.max_len=6\"]]')"
            )
    base = compose_testbed(overrides)
    check_settings(base)  # the command line's own settings, said as they are
    metric = str(base.league.metric)
    entries = league_entries(base)
    scenarios = league_scenarios(base.league.scenarios)
    cfgs, left_out = {}, {}
    for name, extra in scenarios.items():
        where = f" (in league.scenarios entry {text(extra)})"
        refused: dict[str, str] = {}
        try:
            cfgs[name] = method_configs(list(overrides) + extra, entries, check=check_method, left_out=refused)
        except RecipeError as exc:
            message = " ".join(str(exc).split())
            error = LaunchRefusal if isinstance(exc, LaunchRefusal) else TestbedSettingError
            raise error(message if not extra or where in message else message + where) from None
        for label, line in refused.items():
            left_out.setdefault(label, f"on {name}: {line}")
    if left_out:
        entries = {label: extra for label, extra in entries.items() if label not in left_out}
        if not entries:
            label, why = next(iter(left_out.items()))
            raise LaunchRefusal(f"league: every method is left out ({label} {why})")
        cfgs = {name: {key: cfg for key, cfg in methods.items() if key.split("[", 1)[0] not in left_out}
                for name, methods in cfgs.items()}
        for label, why in left_out.items():
            print(f"recipe-apo: note: the league leaves {label} out of every scenario (the recipe's launch refuses "
                  f"it {why})", file=sys.stderr, flush=True)
    return LeaguePlan(base, metric, entries, scenarios, cfgs, left_out)


def run_league(overrides: list[str], out_dir: Path, show_progress: bool = True,
               plan: LeaguePlan | None = None) -> dict[str, Any]:
    """Run every league method on every league scenario; write league.md / league.json / league.png.

    A league run into a folder that holds an earlier league replaces it: once every setting is checked
    (``plan_league``, or the ``plan`` given), the earlier league's own files (``clear_earlier_league``) go before
    any training, so the folder never holds a scenario that league.md does not list."""
    started = time.perf_counter()
    plan = plan if plan is not None else plan_league(overrides)
    base, metric, entries, scenarios = plan.base, plan.metric, plan.entries, plan.scenarios
    cleared = clear_earlier_league(out_dir)
    if cleared:
        print(f"Cleared the earlier league's results in {out_dir}: {', '.join(cleared)}", flush=True)
    summaries = {}
    for i, name in enumerate(scenarios):
        mark_scenario(out_dir / name, name)
        summaries[name] = run_testbed(list(overrides) + scenarios[name], out_dir / name, show_progress,
                                      desc=f"league {name} ({i + 1}/{len(scenarios)})", cfgs=plan.cfgs[name])
    names = [*base.league.methods, *(base.league.get("extra") or {})]
    families = {name: name for name in names}
    families.update({f"{name}_{suffix}": name for name in names for suffix in base.league.variants
                     if f"{name}_{suffix}" in entries})
    league = build_league(summaries, scenarios, metric, families)
    league["left_out"] = dict(plan.left_out)
    league["variants"] = {str(k): [str(o) for o in v] for k, v in base.league.variants.items()}
    league["extra"] = {str(k): [str(o) for o in v] for k, v in (base.league.get("extra") or {}).items()}
    league["wall_s"] = time.perf_counter() - started
    league["overrides"] = list(overrides)
    write_league(league, out_dir)
    return league


# What a league writes: league.md / league.json / league.png in its folder, and each scenario's testbed run in a
# folder of its own, marked by MARKER (written before the scenario trains) so that a later league in the same
# folder removes only what a league wrote.
LEAGUE_FILES = ("league.md", "league.json", "league.png")
MARKER = ".league_scenario.json"


def mark_scenario(folder: Path, name: str) -> None:
    """Mark ``folder`` as a league scenario's, listing the files its run writes (``report.RUN_FILES``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(json.dumps({"scenario": name, "files": list(RUN_FILES)}))


def _earlier_scenarios(out_dir: Path) -> list[Path]:
    """The scenario folders an earlier league wrote in ``out_dir``: those marked by MARKER, and those its
    league.json lists (a league written before the marker)."""
    found = {Path(root) for root, _, files in os.walk(out_dir) if MARKER in files}
    try:
        listed = json.loads((out_dir / "league.json").read_text())["scenarios"]
        found |= {out_dir / name for name, s in listed.items() if s.get("report") == f"{name}/report.md"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return sorted(folder for folder in found if folder.is_dir() and out_dir.resolve() in folder.resolve().parents)


def clear_earlier_league(out_dir: Path) -> list[str]:
    """Remove what an earlier league wrote in ``out_dir``: its league.md / league.json / league.png, and in each
    of its scenario folders the files a testbed run writes and the mark, then the folder if nothing else is
    left in it. Anything else (a file of the user's) stays. Returns the scenarios cleared."""
    if not out_dir.is_dir():
        return []
    cleared = []
    for folder in _earlier_scenarios(out_dir):
        try:
            written = [str(n) for n in json.loads((folder / MARKER).read_text())["files"]
                       if "/" not in str(n) and str(n) not in ("", ".", "..")]
        except (OSError, ValueError, KeyError, TypeError):
            written = []
        for name in dict.fromkeys([*written, *RUN_FILES, MARKER]):
            if (folder / name).is_file():
                (folder / name).unlink()
        cleared.append(folder.relative_to(out_dir).as_posix())
        while folder != out_dir and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    for name in LEAGUE_FILES:
        if (out_dir / name).is_file():
            (out_dir / name).unlink()
    return cleared


def scenario_name(overrides: list[str]) -> str:
    """A scenario's name from its overrides: "default" for none, ``scenario=X`` as X, the rest as written."""
    if not overrides:
        return "default"
    return ",".join(o.split("=", 1)[1] if _key(o) == "scenario" else o for o in overrides)


def league_scenarios(node: Any) -> dict[str, list[str]]:
    """name -> overrides of ``league.scenarios`` (a list of override lists)."""
    out: dict[str, list[str]] = {}
    for extra in node:
        if isinstance(extra, str):
            raise TestbedSettingError(f"league.scenarios must be a list of override lists, e.g. [[],[task.max_len=6]]; "
                             f"got {extra!r} as an entry")
        extra = [str(o) for o in extra]
        name = scenario_name(extra)
        if name.startswith("/") or ".." in name.split("/"):
            raise TestbedSettingError(f"league.scenarios entry {text(extra)}: its folder, {name}, would leave the "
                                      "league's folder; write the value without / or ..")
        if name in out:
            raise TestbedSettingError(f"league.scenarios lists {name} twice")
        out[name] = extra
    if not out:
        raise TestbedSettingError("league.scenarios is empty: list at least one, e.g. league.scenarios=[[]]")
    return out


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
        for key in [c[0] for c in COLUMNS] + [ZV_MEAN, "codapo/kept_prompts_avg", "codapo/resampled_avg"] + [
                c[0] for c in trust_columns()]:
            if key != metric and stat(label, key) is not None:
                row[key] = stat(label, key)
        if ZV_MAX in agg[label]:  # the worst mini-batch of all the seeds' runs
            row[ZV_MAX] = max(run[ZV_MAX] for run in summary["runs"][label].values())
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
           "generation of AGPO's probe plus its training responses. "
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
    """One scenario: its setting, the ranked table, the zero-variance and CoDaPO notes, the pairwise matrix."""
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
    return (lines + _trust_table(s["rows"]) + _zero_variance_table(s["rows"]) + _codapo_lines(s["rows"])
            + _matrix(s, header))


def _trust_table(rows: list[dict[str, Any]]) -> list[str]:
    """Per method, what a round generates and how its trust region acted (means over the rounds, +- SE over
    seeds): the columns some method of the scenario has (a league without AGPO or APO shows none of theirs;
    a summary without the generation keys, none of this table)."""
    columns = [c for c in trust_columns() if any(c[0] in row for row in rows)]
    if not any(key == "tokens_generated_avg" for key, _, _ in columns):
        return []
    lines = [
        "",
        "Generation and trust region (means over the rounds; +- SE over seeds; `-`: not the method's). Tokens count "
        "each response up to its end token, AGPO's probe included; r = pi / pi_old when a token's loss was taken.",
        "",
        "| method | " + " | ".join(h for _, h, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in rows:
        lines.append(f"| {row['method']} | " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns) + " |")
    return lines


# The zero-variance denominator's off-ness per mini-batch (its runtime's metrics, summarised per run).
ZV_MEAN, ZV_MAX = "zero_variance/ratio_dev_mean_avg", "zero_variance/ratio_dev_max_max"


def _zero_variance_table(rows: list[dict[str, Any]]) -> list[str]:
    """The denominator ratios of the methods run with ``algorithm.zero_variance=exclude`` (none: no lines)."""
    zv = [row for row in rows if ZV_MEAN in row]
    if not zv:
        return []
    lines = [
        "",
        "`algorithm.zero_variance=exclude` scales a round's live advantages by B / B_live (T / T_live for "
        "token-mean); verl's actor divides each mini-batch by its own size, so mini-batch j's loss is off "
        "by its live share over the round's (`denominator_ratio`, 1 = exact). |ratio - 1| over the "
        "mini-batches (mean over rounds; +- SE over seeds) and its worst mini-batch over all seeds:",
        "",
        "| method | live share | mean abs(ratio - 1) | max abs(ratio - 1) |",
        "|---|---|---|---|",
    ]
    for row in zv:
        lines.append(f"| {row['method']} | {_cell(row.get('live_share_avg'), '{:.2f}')} | "
                     f"{_cell(row[ZV_MEAN], '{:.3f}')} | {row[ZV_MAX]:.3f} |")
    return lines


def _codapo_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per CoDaPO method: how often it resampled and how many prompts it kept."""
    lines = []
    for row in rows:
        if "codapo/kept_prompts_avg" in row:
            lines += ["", f"{row['method']}: {row['codapo/resampled_avg']['mean']:.2f} of the rounds resampled, "
                          f"{row['codapo/kept_prompts_avg']['mean']:.1f} prompts kept per selection on average."]
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
        from recipe_apo.testbed.plots import plot_league

        plot_league(league, out_dir / "league.png")
