#!/usr/bin/env python
"""Every verdict of a testbed league recomputed from its league.json's per-seed values, and its report checked.

    python scripts/league_verdicts.py results/league.json                           # the pairs beyond seed noise
    python scripts/league_verdicts.py results/league.json --md results/league.md    # and the report's cells
    python scripts/league_verdicts.py results/league_agpo.json results/league_agpo_ablation.json \\
        --md results/league_agpo.md          # a report holding two leagues: their league.json files in its order

The league (``python -m recipe_apo.testbed mode=league``) writes league.json with, per scenario, each method's
ranking metric per seed (each row's ``<metric>.per_seed``) and the paired differences (``matrix[a][b].per_seed``).
This script reads the per-seed values only and applies the league's rule (docs/testbed.md; the testbed's
``report.stats.paired``) with an implementation of its own, sharing no code with the recipe: with d_s = a_s - b_s over
the n seeds, a - b is **beyond seed noise** when

- no seed is missing (a NaN value), n >= 3, and every d_s has the same strict sign; and
- a two-sided paired t-test clears 5%: t = mean(d) / (std(d, ddof 1) / sqrt(n)), P(|T_{n-1}| >= |t|) < 0.05,
  with Student's t by its closed form for whole degrees of freedom (Abramowitz and Stegun 26.7.3-4); d equal on
  every seed (std 0) and non-zero counts as beyond.

It prints, per scenario, the pairs beyond seed noise (winner - loser, mean, seeds agreeing, t, p). With ``--md``
it checks the report against them, one line per mismatch and exit status 1: every cell of each pairwise matrix
("| row - column |": its mean, its seeds on the majority side, bold exactly when beyond), each ranked table's
metric (mean +- SE), rank and *beats* / *trails*, each overview cell's rank, wins-losses and metric, and any
hand-made table of pairs (a header "| scenario | a - b | ..."). Bold cells of other tables are named as not
recomputable from league.json, without failing. A league.json written before the per-seed values (its matrix's
differences only) still gives every verdict; the means, SEs and ranks are then not checked, and it says so.
Exit status 2: a file that cannot be read or is no league.json, in one line.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEVEL = 0.05  # the two-sided level of the league's paired t-test
MIN_SEEDS = 3  # fewer seeds: nothing is beyond seed noise


class LeagueFileError(ValueError):
    """A league.json or report that cannot be read as one."""


# --- the rule ----------------------------------------------------------------------------------------------------

def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` (whole) degrees of freedom: 1 - A(t | df), A by its finite sums
    in theta = atan(|t| / sqrt(df)) (Abramowitz and Stegun 26.7.3 for odd df, 26.7.4 for even)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be 1 or more, got {df}")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:  # sin(theta) (1 + cos^2/2 + (1*3)/(2*4) cos^4 + ... up to cos^(df-2))
        term = total = 1.0
        for k in range(1, df // 2):
            term *= cos2 * (2 * k - 1) / (2 * k)
            total += term
        inside = sin * total
    else:  # (2/pi) (theta + sin(theta) (cos + (2/3) cos^3 + (2*4)/(3*5) cos^5 + ... up to cos^(df-2)))
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= cos2 * (2 * k) / (2 * k + 1)
            total += term
        inside = 2.0 / math.pi * (theta + sin * total)
    return min(1.0, max(0.0, 1.0 - inside))


@dataclass
class Verdict:
    """One ordered pair a - b on one scenario: its per-seed differences and what the rule says of them."""

    diffs: list[float]
    mean: float
    agree: int  # seeds on the majority side
    seeds: int  # seeds with a value
    missing: int
    t: float
    p: float
    beyond: bool


def verdict(diffs: list[float]) -> Verdict:
    """The league's rule on the per-seed differences (module docstring)."""
    finite = [d for d in diffs if math.isfinite(d)]
    n, missing = len(finite), len(diffs) - len(finite)
    mean = math.fsum(finite) / n if n else float("nan")
    positive, negative = sum(d > 0 for d in finite), sum(d < 0 for d in finite)
    t = p = float("nan")
    if n > 1:
        std = math.sqrt(math.fsum((d - mean) ** 2 for d in finite) / (n - 1))
        t = mean / (std / math.sqrt(n)) if std > 0 else (math.copysign(math.inf, mean) if mean else float("nan"))
        p = t_two_sided_p(t, n - 1) if not math.isnan(t) else float("nan")
    one_sided = n > 0 and (positive == n or negative == n)
    beyond = missing == 0 and n >= MIN_SEEDS and one_sided and p < LEVEL
    return Verdict(diffs, mean, max(positive, negative), n, missing, t, p, beyond)


def mean_se(values: list[float]) -> tuple[float, float]:
    """A method's mean over the seeds with a value and its SE, std (ddof 1) / sqrt(seeds), as the league's table."""
    finite = [v for v in values if math.isfinite(v)]
    mean = math.fsum(finite) / len(finite) if finite else float("nan")
    if len(finite) < 2:
        return mean, float("nan")
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
    return mean, std / math.sqrt(len(values))


def ranks(means: dict[str, float]) -> dict[str, int]:
    """Competition ranking, highest mean first: 1 + the methods with a higher mean (a NaN mean is last)."""
    key = {label: m if math.isfinite(m) else -math.inf for label, m in means.items()}
    return {label: 1 + sum(other > key[label] for other in key.values()) for label in key}


# --- a league.json --------------------------------------------------------------------------------------------------

@dataclass
class Scenario:
    """One scenario of a league.json, recomputed: its labels (the league's order), per label its values per seed
    (None: a league.json without them), per ordered pair its verdict, and what the file itself stored."""

    name: str
    labels: list[str]
    values: dict[str, list[float]] | None
    verdicts: dict[tuple[str, str], Verdict]
    stored: dict[tuple[str, str], dict[str, Any]]

    def mean_se(self, label: str) -> tuple[float, float]:
        return mean_se(self.values[label])

    def ranks(self) -> dict[str, int]:
        return ranks({label: self.mean_se(label)[0] for label in self.labels})

    def wins(self, label: str) -> set[str]:
        return {b for b in self.labels if b != label and self.verdicts[label, b].beyond
                and self.verdicts[label, b].mean > 0}

    def losses(self, label: str) -> set[str]:
        return {b for b in self.labels if b != label and self.verdicts[label, b].beyond
                and self.verdicts[label, b].mean < 0}


@dataclass
class League:
    path: Path
    metric: str
    scenarios: dict[str, Scenario]


def _floats(values: Any, what: str) -> list[float]:
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in values):
        raise LeagueFileError(f"{what} is not a list of numbers")
    return [float(v) for v in values]


def read_league(path: Path) -> League:
    """A league.json, each scenario's verdicts recomputed from its per-seed values (or, in a league.json written
    before them, from its matrix's per-seed differences)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LeagueFileError(f"{path}: not readable as JSON ({exc})") from None
    try:
        metric, raw = str(data["metric"]), data["scenarios"]
        if not isinstance(raw, dict) or not raw:
            raise LeagueFileError(f"{path}: 'scenarios' holds no scenario")
        scenarios = {name: _scenario(name, s, metric, path) for name, s in raw.items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise LeagueFileError(f"{path}: not a league.json (python -m recipe_apo.testbed mode=league writes one); "
                              f"missing or malformed {exc}") from None
    return League(path, metric, scenarios)


def _scenario(name: str, s: dict[str, Any], metric: str, path: Path) -> Scenario:
    rows = {row["method"]: row for row in s["rows"]}
    labels = list(s.get("methods") or rows)
    if set(labels) != set(rows) or set(labels) != set(s["matrix"]):
        raise LeagueFileError(f"{path}: scenario {name}: its rows, methods and matrix list different methods")
    seeds = len(s["seeds"])
    where = f"{path}: scenario {name}"
    values = None
    if all("per_seed" in (rows[label].get(metric) or {}) for label in labels):
        values = {label: _floats(rows[label][metric]["per_seed"], f"{where}: {label}'s {metric}.per_seed")
                  for label in labels}
        if any(len(v) != seeds for v in values.values()):
            raise LeagueFileError(f"{where}: a method's {metric}.per_seed does not have one value per seed ({seeds})")
    verdicts, stored = {}, {}
    for a in labels:
        for b in labels:
            if a == b:
                continue
            stored[a, b] = s["matrix"][a][b]
            if values is not None:
                diffs = [x - y for x, y in zip(values[a], values[b])]
            elif "per_seed" in stored[a, b]:
                diffs = _floats(stored[a, b]["per_seed"], f"{where}: matrix[{a}][{b}].per_seed")
            else:
                raise LeagueFileError(f"{where}: neither the methods' {metric}.per_seed nor the matrix's per-seed "
                                      f"differences ({a} - {b}): nothing to recompute from")
            verdicts[a, b] = verdict(diffs)
    return Scenario(name, labels, values, verdicts, stored)


def json_mismatches(league: League) -> list[str]:
    """Where the league.json's own stored differences and verdicts disagree with the recomputed ones."""
    out = []
    for s in league.scenarios.values():
        for (a, b), v in s.verdicts.items():
            cell = s.stored[a, b]
            if s.values is not None and "per_seed" in cell and not _same(cell["per_seed"], v.diffs):
                out.append(f"{league.path}: {s.name}: matrix[{a}][{b}].per_seed {cell['per_seed']} is not "
                           f"{a}'s values minus {b}'s {v.diffs}")
            if "beyond_seed_noise" in cell and bool(cell["beyond_seed_noise"]) != v.beyond:
                out.append(f"{league.path}: {s.name}: {a} - {b} stored as "
                           f"{'beyond' if cell['beyond_seed_noise'] else 'within'} seed noise, recomputed "
                           f"{_said(v)}")
    return out


def _same(stored: list[float], diffs: list[float]) -> bool:
    return len(stored) == len(diffs) and all(
        (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-12 for x, y in zip(map(float, stored), diffs))


def _said(v: Verdict) -> str:
    return (f"{'beyond' if v.beyond else 'within'} seed noise ({v.mean:+.3f}, {v.agree}/{v.seeds}, "
            f"t={v.t:+.2f}, p={v.p:.4f})")


# --- the report -------------------------------------------------------------------------------------------------

@dataclass
class Table:
    heading: str  # the last heading line before the table
    lines: list[str]  # the table's lines, header first
    line_no: int  # 1-based line of its header in the report

    def cells(self, line: str) -> list[str]:
        return [c.strip().replace("`", "") for c in line.strip().strip("|").split("|")]

    @property
    def header(self) -> list[str]:
        return self.cells(self.lines[0])

    def body(self) -> list[tuple[int, list[str]]]:
        return [(self.line_no + i, self.cells(line)) for i, line in enumerate(self.lines) if i > 0
                and not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip())]


def read_tables(text: str) -> list[Table]:
    """The markdown tables of a report, each with the heading above it (fenced code left out)."""
    tables, heading, fenced, current = [], "", False, None
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            if current is None:
                current = Table(heading, [], no)
                tables.append(current)
            current.lines.append(line)
            continue
        current = None
        if not fenced and line.startswith("#"):
            heading = line
    return tables


DIFFERENCE = re.compile(r"(\*\*)?(?P<mean>[+-]\d+\.\d+|nan)(?:\*\*)?(?:\s+(?P<agree>\d+)/(?P<seeds>\d+))?(\*\*)?")
OVERVIEW = re.compile(r"(?P<rank>\d+) \((?P<wins>\d+)-(?P<losses>\d+)\), (?P<cell>.*)")
PAIR = re.compile(r"(?P<a>\S+) - (?P<b>\S+)")


def _table_cell(mean: float, se: float) -> str:
    """The league's ``_cell`` of the ranking metric, from the recomputed mean and SE."""
    if not math.isfinite(mean):
        return "-"
    return f"{mean:.3f} (one seed)" if not math.isfinite(se) else f"{mean:.3f} +- {se:.3f}"


def _difference(cell: str, v: Verdict, where: str) -> list[str]:
    """A cell of a pairwise table against its verdict: the mean, the seeds on the majority side, bold or not."""
    m = DIFFERENCE.fullmatch(cell)
    if not m:
        return [f"{where}: cell '{cell}' is not a paired difference"]
    out = []
    bold = cell.startswith("**")
    expected = f"{v.mean:+.3f}" if math.isfinite(v.mean) else "nan"
    # Compared as printed, where -0.000 and +0.000 are one value (the league negates a stored a - b of 0.0 to give
    # b - a, so an exact tie can print either).
    if (m["mean"] != expected if "nan" in (m["mean"], expected) else float(m["mean"]) != float(expected)):
        out.append(f"{where}: mean {m['mean']}, recomputed {expected}")
    if m["agree"] is not None and (int(m["agree"]), int(m["seeds"])) != (v.agree, v.seeds):
        out.append(f"{where}: {m['agree']}/{m['seeds']} seeds, recomputed {v.agree}/{v.seeds}")
    if bold != v.beyond:
        out.append(f"{where}: {'bold' if bold else 'not bold'}, recomputed {_said(v)}")
    return out


def check_report(text: str, leagues: list[League], name: str = "report") -> tuple[list[str], list[str], int]:
    """(mismatches, notes, bold cells checked) of a report against its leagues, in the order it holds them."""
    expected = [(league, s) for league in leagues for s in league.scenarios.values()]
    found: dict[int, set[str]] = {}  # scenario index -> the kinds of table the report had for it
    mismatches, notes, bold_checked = [], [], 0
    at, overview = -1, -1
    for table in read_tables(text):
        # Scenario sections ("## <name>: <overrides>") advance in the leagues' order; any other heading is
        # the report's own text.
        while at + 1 < len(expected) and _names_scenario(table.heading, expected[at + 1][1].name) and (
                at < 0 or not _names_scenario(table.heading, expected[at][1].name)):
            at += 1
        header = table.header
        bolds = sum(c.startswith("**") for _, cells in table.body() for c in cells)
        where = f"{name}:{table.line_no}"
        if "Overview: rank" in table.heading and header[0] == "method":
            overview += 1
            if overview >= len(leagues):
                mismatches.append(f"{where}: an overview table beyond the {len(leagues)} league(s) given")
                continue
            mismatches += _check_overview(table, leagues[overview], where)
        elif header[0] == "row - column" and at >= 0:
            league, s = expected[at]
            found.setdefault(at, set()).add("matrix")
            out, n = _check_matrix(table, s, where)
            mismatches, bold_checked = mismatches + out, bold_checked + n
        elif header[:2] == ["rank", "method"] and header[-2:] == ["beats", "trails"] and at >= 0:
            found.setdefault(at, set()).add("ranked")
            mismatches += _check_ranked(table, expected[at][1], where)
        elif header[0] == "scenario" and len(header) > 1 and all(PAIR.fullmatch(h) for h in header[1:]):
            out, n = _check_pairs(table, leagues, where)
            mismatches, bold_checked = mismatches + out, bold_checked + n
        elif bolds:
            notes.append(f"{where}: {bolds} bold cell(s) in the table under '{table.heading.lstrip('# ')}' are not "
                         "recomputable from league.json; not checked")
    for i, (league, s) in enumerate(expected):
        for kind in ("ranked", "matrix"):
            if kind not in found.get(i, set()):
                mismatches.append(f"{name}: scenario {s.name} of {league.path}: no {kind} table under a heading "
                                  f"'{s.name}: ...' in the report, in the order of the league.json(s) given")
    if overview + 1 < len(leagues):
        mismatches.append(f"{name}: {overview + 1} overview table(s) for {len(leagues)} league(s)")
    if any(s.values is None for _, s in expected):
        notes.append("a league.json without per-seed values (written before they were stored): verdicts from its "
                     "matrix's differences; means, SEs and ranks not recomputed")
    return mismatches, notes, bold_checked


def _names_scenario(heading: str, name: str) -> bool:
    return heading.lstrip("#").strip().startswith(f"{name}: ")


def _check_matrix(table: Table, s: Scenario, where: str) -> tuple[list[str], int]:
    columns, out, bolds = table.header[1:], [], 0
    rows = [cells[0] for _, cells in table.body()]
    if set(columns) != set(s.labels) or sorted(rows) != sorted(s.labels):
        return [f"{where}: scenario {s.name}'s matrix lists {sorted(set(rows) | set(columns))}, its league.json "
                f"{sorted(s.labels)}"], 0
    for line_no, cells in table.body():
        a = cells[0]
        for b, cell in zip(columns, cells[1:]):
            if a == b:
                if cell != ".":
                    out.append(f"{name_line(where, line_no)}: {a} - {a} should be '.', is '{cell}'")
                continue
            bolds += cell.startswith("**")
            out += _difference(cell, s.verdicts[a, b], f"{name_line(where, line_no)}: {s.name}: {a} - {b}")
    return out, bolds


def name_line(where: str, line_no: int) -> str:
    """``<report>:<line>`` of a table's row, from ``where`` (``<report>:<header line>``)."""
    return f"{where.rsplit(':', 1)[0]}:{line_no}"


def _check_ranked(table: Table, s: Scenario, where: str) -> list[str]:
    out, seen = [], set()
    rank = s.ranks() if s.values is not None else None
    for line_no, cells in table.body():
        label, at = cells[1], f"{name_line(where, line_no)}: {s.name}: {cells[1]}"
        if label not in s.labels:
            out.append(f"{at}: not a method of the scenario's league.json")
            continue
        seen.add(label)
        listed = {side: set() if cell == "-" else {x.strip() for x in cell.split(",")}
                  for side, cell in (("beats", cells[-2]), ("trails", cells[-1]))}
        for side, got in (("beats", s.wins(label)), ("trails", s.losses(label))):
            if listed[side] != got:
                out.append(f"{at}: {side} {', '.join(sorted(listed[side])) or '-'}, recomputed "
                           f"{', '.join(sorted(got)) or '-'}")
        if rank is not None:
            cell = _table_cell(*s.mean_se(label))
            if cells[2] != cell:
                out.append(f"{at}: {cells[2]}, recomputed {cell}")
            if cells[0] != str(rank[label]):
                out.append(f"{at}: rank {cells[0]}, recomputed {rank[label]}")
    if seen != set(s.labels):
        out.append(f"{where}: scenario {s.name}'s ranked table lacks {', '.join(sorted(set(s.labels) - seen))}")
    return out


def _check_overview(table: Table, league: League, where: str) -> list[str]:
    names = table.header[1:]
    if names != list(league.scenarios):
        return [f"{where}: overview of scenarios {names}, {league.path} holds {list(league.scenarios)}"]
    out = []
    for line_no, cells in table.body():
        label = cells[0]
        for name, cell in zip(names, cells[1:]):
            s, at = league.scenarios[name], f"{name_line(where, line_no)}: overview {label} on {name}"
            m = OVERVIEW.fullmatch(cell)
            if label not in s.labels or not m:
                out.append(f"{at}: '{cell}' is no overview cell of a method of the league")
                continue
            counts = (len(s.wins(label)), len(s.losses(label)))
            if (int(m["wins"]), int(m["losses"])) != counts:
                out.append(f"{at}: {m['wins']}-{m['losses']} beyond seed noise, recomputed {counts[0]}-{counts[1]}")
            if s.values is not None:
                expected = f"{s.ranks()[label]}, {_table_cell(*s.mean_se(label))}"
                if f"{m['rank']}, {m['cell']}" != expected:
                    out.append(f"{at}: rank and metric {m['rank']}, {m['cell']}, recomputed {expected}")
    return out


def _check_pairs(table: Table, leagues: list[League], where: str) -> tuple[list[str], int]:
    """A hand-made table of pairs: rows are scenarios, columns 'a - b'; each cell the paired difference."""
    out, bolds = [], 0
    pairs = [PAIR.fullmatch(h) for h in table.header[1:]]
    for line_no, cells in table.body():
        for pair, cell in zip(pairs, cells[1:]):
            a, b, name = pair["a"], pair["b"], cells[0]
            at = f"{name_line(where, line_no)}: {name}: {a} - {b}"
            holders = [lg.scenarios[name] for lg in leagues if name in lg.scenarios
                       and {a, b} <= set(lg.scenarios[name].labels)]
            if not holders:
                out.append(f"{at}: no league.json given holds this pair on this scenario")
                continue
            bolds += cell.startswith("**")
            out += _difference(cell, holders[0].verdicts[a, b], at)
    return out, bolds


# --- the command line -------------------------------------------------------------------------------------------

def summary_lines(league: League) -> list[str]:
    """The pairs beyond seed noise per scenario, winner first (each is two bold cells of the matrix)."""
    first = next(iter(league.scenarios.values()))
    kind = ("each method's per-seed values" if all(s.values is not None for s in league.scenarios.values())
            else "the matrix's per-seed differences (no per-seed values stored)")
    lines = [f"{league.path}: {len(league.scenarios)} scenario(s), {len(first.labels)} methods; "
             f"{league.metric} from {kind}"]
    for s in league.scenarios.values():
        beyond = [(a, b, v) for (a, b), v in s.verdicts.items() if v.beyond and v.mean > 0]
        lines.append(f"{s.name}: {len(beyond)} pair(s) beyond seed noise")
        for a, b, v in beyond:
            diffs = " ".join(f"{d:+.3f}" for d in v.diffs)
            lines.append(f"  {a} - {b}: {v.mean:+.3f} {v.agree}/{v.seeds}, t={v.t:+.2f}, p={v.p:.4f} "
                         f"(per seed {diffs})")
    return lines


# --- an earlier report against a league.json (the same league run again, e.g. on another machine) -------------------

def earlier_verdicts(text: str, league: League) -> dict[tuple[str, str, str], tuple[float, bool]]:
    """(scenario, a, b) -> (mean, bold) of each pairwise matrix of an earlier report whose scenario and methods the
    league also has (each unordered pair once, ``a`` before ``b`` in the league's order)."""
    out = {}
    for table in read_tables(text):
        if table.header[0] != "row - column":
            continue
        scenario = next((s for s in league.scenarios.values() if _names_scenario(table.heading, s.name)), None)
        if scenario is None:
            continue
        for _, cells in table.body():
            a = cells[0]
            for b, cell in zip(table.header[1:], cells[1:]):
                m = DIFFERENCE.fullmatch(cell)
                if a == b or not m or a not in scenario.labels or b not in scenario.labels or m["mean"] == "nan":
                    continue
                if scenario.labels.index(a) < scenario.labels.index(b):
                    out[scenario.name, a, b] = (float(m["mean"]), cell.startswith("**"))
    return out


def compare_lines(text: str, league: League, name: str) -> list[str]:
    """Each pair beyond seed noise in the earlier report or in the league, and what became of it: held (beyond in
    both, one sign), within (beyond before, within now), reversed (beyond in both, opposite signs), new (beyond now
    only); then the counts."""
    counts = {"held": 0, "within": 0, "reversed": 0, "new": 0}
    lines = []
    for (scenario, a, b), (before, bold) in earlier_verdicts(text, league).items():
        now = league.scenarios[scenario].verdicts[a, b]
        if not (bold or now.beyond):
            continue
        kind = ("new" if not bold else "within" if not now.beyond
                else "held" if (before > 0) == (now.mean > 0) else "reversed")
        counts[kind] += 1
        lines.append(f"{scenario}: {a} - {b}: {before:+.3f}{' (beyond)' if bold else ''} in {name}, "
                     f"{now.mean:+.3f}{' (beyond)' if now.beyond else ''} in {league.path}: {kind}")
    earlier = counts["held"] + counts["within"] + counts["reversed"]
    lines.append(f"{name} against {league.path}: of {earlier} pair(s) beyond seed noise in {name}, {counts['held']} "
                 f"held, {counts['within']} within seed noise, {counts['reversed']} reversed; {counts['new']} beyond "
                 f"seed noise in {league.path} only")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python scripts/league_verdicts.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("league", type=Path, nargs="+",
                        help="league.json file(s); several when one report holds several leagues, in its order")
    parser.add_argument("--md", type=Path, help="the report to check (a league.md, or a report quoting it)")
    parser.add_argument("--against", type=Path, help="an earlier report of the same league (e.g. run on another "
                        "machine: `git show <commit>:results/league.md`): which of its verdicts the league.json "
                        "keeps, loses, reverses or adds (one league.json)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        leagues = [read_league(path) for path in args.league]
        text = args.md.read_text() if args.md is not None else None
    except LeagueFileError as exc:
        print(f"league_verdicts: {exc}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as exc:
        print(f"league_verdicts: {args.md}: not readable ({exc})", file=sys.stderr)
        return 2
    mismatches = []
    for league in leagues:
        print("\n".join(summary_lines(league)))
        mismatches += json_mismatches(league)
    if args.against is not None:
        if len(leagues) != 1:
            print(f"league_verdicts: --against {args.against}: compares one league.json with it, {len(leagues)} given",
                  file=sys.stderr)
            return 2
        try:
            earlier = args.against.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"league_verdicts: {args.against}: not readable ({exc})", file=sys.stderr)
            return 2
        print("\n".join(compare_lines(earlier, leagues[0], str(args.against))))
    if text is not None:
        out, notes, bolds = check_report(text, leagues, str(args.md))
        mismatches += out
        for note in notes:
            print(f"note: {note}")
        if not out:
            print(f"{args.md}: every pairwise cell agrees with the recomputed verdicts ({bolds} bold), and so do "
                  "its ranked tables and overview")
    for line in mismatches:
        print(line, file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
