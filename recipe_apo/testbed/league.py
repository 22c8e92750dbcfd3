"""``python -m recipe_apo.testbed mode=league``: every method of ``league`` on every scenario of it, paired over
the seeds, ranked against every other method per scenario.

The methods are ``league.methods`` (labels of ``methods``) and ``league.extra`` (the league's own), each as it is
and with its ``league.variants`` (by default ``<method>_zv``: ``algorithm.zero_variance=exclude``, for the
methods ``league.variant_of`` names). Each scenario is one ordinary testbed
run (its own folder with report.md, summary.json and plots); the league reads their paired statistics
(``report.stats.paired``, the testbed's verdict rule: beyond seed noise when every seed agrees on the sign and a
paired t-test clears 5%) and writes ``league.md``, ``league.json`` and ``league.png`` beside them
(``report.league``).
"""

from __future__ import annotations

import json
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
from recipe_apo.testbed.launch_refusal import LaunchRefusal
from recipe_apo.testbed.report.league import LEAGUE_FILES, build_league, write_league
from recipe_apo.testbed.report.summary import RUN_FILES
from recipe_apo.testbed.runner import check_method, run_testbed
from recipe_apo.testbed.setting_check import check_settings
from recipe_apo.testbed.setting_rules import text


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
    planned = {name: scenario_configs(plan.cfgs[name]) for name in scenarios}
    kept = {}
    if base.league.get("resume", False):
        kept = {name: summary for name in scenarios
                if (summary := finished_scenario(out_dir / name, name, planned[name])) is not None}
    cleared = clear_earlier_league(out_dir, keep=[out_dir / name for name in kept])
    if cleared:
        print(f"Cleared the earlier league's results in {out_dir}: {', '.join(cleared)}", flush=True)
    if kept:
        print(f"Resuming the league in {out_dir}: kept the finished scenario(s) {', '.join(kept)}", flush=True)
    summaries = {}
    for i, name in enumerate(scenarios):
        if name in kept:
            summaries[name] = kept[name]
            continue
        mark_scenario(out_dir / name, name, planned[name])
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


# What a league writes: league.md / league.json / league.png in its folder (report.league.LEAGUE_FILES), and each
# scenario's testbed run in a folder of its own, marked by MARKER (written before the scenario trains) so that a
# later league in the same folder removes only what a league wrote.
MARKER = ".league_scenario.json"
# What a scenario's run once wrote and no longer writes (its plot of the methods' series had another name), for
# the scenario folders of a league written before the marker (found through its league.json).
EARLIER_RUN_FILES = ("anchor.png",)


def mark_scenario(folder: Path, name: str, configs: dict[str, Any] | None = None) -> None:
    """Mark ``folder`` as a league scenario's, listing the files its run writes (``report.summary.RUN_FILES``) and
    the configs it runs (``scenario_configs``: what a resumed league compares)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(json.dumps({"scenario": name, "files": list(RUN_FILES), "configs": configs}))


# What a scenario's configs hold that does not change its run: the league's own settings (league.resume among them)
# and the mode.
NOT_A_RUNS_SETTING = ("league", "mode")


def scenario_configs(cfgs: dict[str, DictConfig]) -> dict[str, Any]:
    """label -> a scenario's method config as plain values, less what does not change its run."""
    from recipe_apo.testbed.setting_check import read_values

    out = {}
    for label, cfg in cfgs.items():
        values = read_values(cfg)
        out[label] = {k: v for k, v in values.items() if k not in NOT_A_RUNS_SETTING}
    return json.loads(json.dumps(out))  # as the mark holds them (tuples as lists)


def finished_scenario(folder: Path, name: str, configs: dict[str, Any]) -> dict[str, Any] | None:
    """A scenario an earlier league finished in ``folder`` with these ``configs`` on this machine's kernels: its
    summary (read back from summary.json), or None (missing, another scenario's, other configs, other kernels)."""
    from recipe_apo.testbed.kernels import fingerprint

    try:
        mark = json.loads((folder / MARKER).read_text())
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or not isinstance(summary, dict):
        return None
    if mark.get("scenario") != name or mark.get("configs") != configs or list(summary.get("methods", {})) != list(
            configs):
        return None
    if (summary.get("kernels") or {}).get("fingerprint") != fingerprint():
        return None  # another machine's kernels give other figures (docs/testbed.md, "Reproducibility")
    return summary


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


def clear_earlier_league(out_dir: Path, keep: list[Path] = ()) -> list[str]:
    """Remove what an earlier league wrote in ``out_dir``: its league.md / league.json / league.png, and in each
    of its scenario folders but those in ``keep`` the files a testbed run writes and the mark, then the folder if
    nothing else is left in it. Anything else (a file of the user's) stays. Returns the scenarios cleared."""
    if not out_dir.is_dir():
        return []
    cleared = []
    kept = {folder.resolve() for folder in keep}
    for folder in _earlier_scenarios(out_dir):
        if folder.resolve() in kept:
            continue
        try:
            written = [str(n) for n in json.loads((folder / MARKER).read_text())["files"]
                       if "/" not in str(n) and str(n) not in ("", ".", "..")]
        except (OSError, ValueError, KeyError, TypeError):
            written = []
        for name in dict.fromkeys([*written, *RUN_FILES, *EARLIER_RUN_FILES, MARKER]):
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
