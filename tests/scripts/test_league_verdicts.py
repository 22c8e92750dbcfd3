"""scripts/league_verdicts.py: a league's verdicts recomputed from its per-seed values alone (worked out by hand
below), and a report whose cells disagree with them refused, one line per cell, exit status 1."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import sys
from subprocess import CompletedProcess

import pytest
from helpers.paths import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

SPEC = importlib.util.spec_from_file_location("league_verdicts", ROOT / "scripts" / "league_verdicts.py")
SCRIPT = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = SCRIPT  # its dataclasses look their module up there
SPEC.loader.exec_module(SCRIPT)

METRIC = "success_final"
# Final success per seed, multiples of 1/16 so every difference below is exact in binary.
DEFAULT = {"a": [0.5, 0.625, 0.75, 0.5], "b": [0.375, 0.5, 0.5, 0.375], "c": [0.4375, 0.5625, 0.25, 0.4375]}
SIX = {"a": [0.625] * 5 + [0.5], "b": [0.5] * 6, "c": [0.625] * 6}
# By hand, 4 seeds (t with 3 degrees of freedom, 5% two-sided critical value 3.182):
#   a - b = [1/8, 1/8, 1/4, 1/8]: mean 5/32 = 0.15625; deviations -1/32 (x3), 3/32; sum of squares 12/1024,
#     / 3 = 1/256, std 1/16, SE 1/32, t = 5.0 -> every seed positive and t > 3.182: BEYOND (both cells bold).
#     p = 1 - (2/pi) (atan(5/sqrt 3) + (5/sqrt 3) / (1 + 25/3)) = 0.0154 (A&S 26.7.3).
#   a - c = [1/16, 1/16, 1/2, 1/16]: mean 11/64; deviations -7/64 (x3), 21/64; sum of squares 588/4096,
#     / 3 = 196/4096, std 14/64, SE 7/64, t = 11/7 = 1.571 < 3.182: within (4/4 agree).
#   b - c = [-1/16, -1/16, 1/4, -1/16]: 3 seeds of 4 negative, mean +1/64 = 0.016: within.
# 6 seeds (5 degrees of freedom, critical value 2.571):
#   a - b = [1/8] x 5 + [0]: mean 5/48; deviations 1/48 (x5), -5/48; sum of squares 30/2304, / 5 = 6/2304,
#     std sqrt(6)/48, SE 1/48, t = 5.0 > 2.571, but seed 6 ties: within (5/6).
#   c - b = [1/8] x 6: std 0, mean 1/8: BEYOND (the rule's constant difference).
#   c - a = [0] x 5 + [1/8]: 1 seed positive, none negative: within (1/6).
BOLD = {("default", "a", "b"), ("default", "b", "a"), ("six", "c", "b"), ("six", "b", "c")}


def run(*args):
    """The script's main, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = SCRIPT.main([str(a) for a in args])
    return CompletedProcess(args, code, out.getvalue(), err.getvalue())


def hand_written() -> dict:
    """A league.json with what the script reads: per scenario its seeds, each method's per-seed final success,
    and the matrix's pairs (nothing stored in them)."""
    scenarios = {}
    for name, values in (("default", DEFAULT), ("six", SIX)):
        scenarios[name] = {
            "seeds": list(range(len(values["a"]))),
            "rows": [{"method": label, METRIC: {"per_seed": v}} for label, v in values.items()],
            "matrix": {a: {b: {} for b in values if b != a} for a in values},
        }
    return {"metric": METRIC, "scenarios": scenarios}


@pytest.mark.parametrize(("t", "df", "p"), [
    (1.0, 1, 0.5),  # theta = pi/4: A = 2 theta / pi = 1/2
    (math.sqrt(2), 2, 1 - 1 / math.sqrt(2)),  # A = sin(theta) = t / sqrt(2 + t^2)
    (math.sqrt(3), 3, 0.5 - 1 / math.pi),  # theta = pi/4: A = (2/pi)(pi/4 + 1/2)
    (2.0, 4, 1 - 5 * math.sqrt(2) / 8),  # theta = pi/4: A = sin(theta)(1 + cos^2(theta)/2) = (sqrt 2/2)(5/4)
    (0.0, 7, 1.0),
    (math.inf, 3, 0.0),
    # Student's t's 97.5% quantiles as tabulated (9-10 digits): p = 0.05.
    (12.70620474, 1, 0.05), (4.302652730, 2, 0.05), (3.182446305, 3, 0.05), (2.570581836, 5, 0.05),
    (2.228138852, 10, 0.05), (2.042272456, 30, 0.05),
])
def test_students_t_by_hand(t, df, p):
    assert SCRIPT.t_two_sided_p(t, df) == pytest.approx(p, abs=1e-9)
    assert SCRIPT.t_two_sided_p(-t, df) == pytest.approx(p, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-3, 60.0), st.integers(1, 80))
def test_students_t_equals_the_testbeds_continued_fraction(t, df):
    """The testbed's p-value (the incomplete beta's continued fraction) and this closed form are two
    implementations of one function. Below t = 1e-3 (p above 0.999) the fraction loses digits: at t = 6e-8,
    df = 32 it gives 1.0 where p = 1 - 2 t f(0) = 1 - 4.72e-8 to first order, as the closed form gives."""
    from recipe_apo.testbed.report.stats import t_two_sided_p

    assert SCRIPT.t_two_sided_p(t, df) == pytest.approx(t_two_sided_p(t, df), abs=1e-9)


@pytest.mark.parametrize(("diffs", "t", "agree", "beyond"), [
    ([0.125, 0.125, 0.25, 0.125], 5.0, 4, True),
    ([0.0625, 0.0625, 0.5, 0.0625], 11 / 7, 4, False),  # every seed agrees, t short of 3.182
    ([0.125] * 5 + [0.0], 5.0, 5, False),  # t clears 2.571, a seed ties
    ([0.125] * 6, math.inf, 6, True),  # the same non-zero difference on every seed
    ([0.0] * 4, math.nan, 0, False),
    ([0.1, 0.2, math.nan, 0.3, 0.4], None, 4, False),  # a seed missing
    ([0.5, 0.5], math.inf, 2, False),  # fewer than 3 seeds
])
def test_the_rule_by_hand(diffs, t, agree, beyond):
    v = SCRIPT.verdict(diffs)
    assert (v.agree, v.beyond) == (agree, beyond)
    if t is not None:
        assert v.t == pytest.approx(t, rel=1e-12, nan_ok=True)


@pytest.mark.parametrize(("cell", "diffs", "wrong"), [
    ("-0.000 0/4", [0.0] * 4, []),  # an exact tie prints either sign of zero
    ("+0.000 0/4", [0.0] * 4, []),
    ("nan", [math.nan] * 4, []),
    ("+0.001 0/4", [0.0] * 4, ["x: mean +0.001, recomputed +0.000"]),
    ("**+0.125** 4/4", [0.125] * 4, []),
    ("**+0.125 4/4**", [0.125] * 4, []),
    ("+0.125 3/4", [0.125] * 4, ["x: 3/4 seeds, recomputed 4/4",
                                 "x: not bold, recomputed beyond seed noise (+0.125, 4/4, t=+inf, p=0.0000)"]),
])
def test_a_cell_as_printed(cell, diffs, wrong):
    assert SCRIPT._difference(cell, SCRIPT.verdict(diffs), "x") == wrong


def test_a_hand_written_league_json_gives_exactly_the_bold_cells(tmp_path):
    path = tmp_path / "league.json"
    path.write_text(json.dumps(hand_written()))
    league = SCRIPT.read_league(path)
    bold = {(s.name, a, b) for s in league.scenarios.values() for (a, b), v in s.verdicts.items() if v.beyond}
    assert bold == BOLD
    result = run(path)
    assert (result.returncode, result.stderr) == (0, "")
    p = 1 - 2 / math.pi * (math.atan(5 / math.sqrt(3)) + 5 * math.sqrt(3) / 28)
    assert f"{p:.4f}" == "0.0154"
    assert result.stdout.splitlines() == [
        f"{path}: 2 scenario(s), 3 methods; {METRIC} from each method's per-seed values",
        "default: 1 pair(s) beyond seed noise",
        "  a - b: +0.156 4/4, t=+5.00, p=0.0154 (per seed +0.125 +0.125 +0.250 +0.125)",
        "six: 1 pair(s) beyond seed noise",
        "  c - b: +0.125 6/6, t=+inf, p=0.0000 (per seed +0.125 +0.125 +0.125 +0.125 +0.125 +0.125)",
    ]


def _fake_summary(values: dict[str, list[float]]) -> dict:
    """A scenario's summary as the testbed writes it, from hand-set final successes per seed."""
    from recipe_apo.testbed.report.stats import compare_runs

    labels, seeds = list(values), list(range(len(next(iter(values.values())))))
    per_run = {label: {str(s): {METRIC: v[s]} for s in seeds} for label, v in values.items()}
    aggregate, comparisons = compare_runs(per_run, labels, seeds, metrics=[METRIC])
    return {"methods": {label: {} for label in labels}, "seeds": seeds, "runs": per_run, "aggregate": aggregate,
            "paired": comparisons, "scenario": None, "wall_s": 1.0,
            "config": {"rounds": 10, "actor_rollout_ref": {"actor": {"ppo_epochs": 1}},
                       "data": {"max_response_length": 20},
                       "task": {"name": "reverse", "alphabet": 4, "min_len": 1, "max_len": 8, "filler_mean": 0.6}}}


@pytest.fixture
def written(tmp_path):
    """The league's own writer (league.json, league.md) on the hand-set values."""
    from recipe_apo.testbed.report.league import build_league, write_league

    league = build_league({"default": _fake_summary(DEFAULT), "six": _fake_summary(SIX)},
                          {"default": [], "six": ["seeds=[0,1,2,3,4,5]"]}, METRIC)
    write_league(league, tmp_path, plot=False)
    return tmp_path / "league.json", tmp_path / "league.md"


def test_league_json_holds_each_methods_values_per_seed(written):
    on_disk = json.loads(written[0].read_text())
    for name, values in (("default", DEFAULT), ("six", SIX)):
        rows = {row["method"]: row for row in on_disk["scenarios"][name]["rows"]}
        assert {label: row[METRIC]["per_seed"] for label, row in rows.items()} == values


def test_the_leagues_report_agrees_and_a_wrong_bold_cell_fails(written, tmp_path):
    path, md = written
    text = md.read_text()
    good = run(path, "--md", md)
    assert (good.returncode, good.stderr) == (0, "")
    assert good.stdout.splitlines()[-1] == (f"{md}: every pairwise cell agrees with the recomputed verdicts (4 bold), "
                                            "and so do its ranked tables and overview")
    # One cell of the default scenario's matrix, a - c (within seed noise), printed bold.
    assert text.count("| +0.172 4/4 |") == 1
    bad = tmp_path / "bad.md"
    bad.write_text(text.replace("| +0.172 4/4 |", "| **+0.172** 4/4 |"))
    line = next(i for i, x in enumerate(bad.read_text().splitlines(), 1) if "**+0.172**" in x)
    refused = run(path, "--md", bad)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"{bad}:{line}: default: a - c: bold, recomputed within seed noise (+0.172, 4/4, t=+1.57, p=0.2141)"]
    # A verdict beyond seed noise printed plain, and a method listed as beaten that is not.
    assert text.count("| . | **+0.156** 4/4 |") == 1
    bad.write_text(text.replace("| . | **+0.156** 4/4 |", "| . | +0.156 4/4 |")
                   .replace("| b | - |\n| 2 | b |", "| b, c | - |\n| 2 | b |"))
    refused = run(path, "--md", bad)
    assert refused.returncode == 1
    assert [x.split(": ", 1)[1] for x in refused.stderr.splitlines()] == [
        "default: a: beats b, c, recomputed b",
        "default: a - b: not bold, recomputed beyond seed noise (+0.156, 4/4, t=+5.00, p=0.0154)"]


def test_a_league_json_without_per_seed_values_still_gives_the_verdicts(written, tmp_path):
    path, md = written
    old = json.loads(path.read_text())
    for scenario in old["scenarios"].values():
        for row in scenario["rows"]:
            del row[METRIC]["per_seed"]
    old_path = tmp_path / "old.json"
    old_path.write_text(json.dumps(old))
    result = run(old_path, "--md", md)
    assert (result.returncode, result.stderr) == (0, "")
    assert "  a - b: +0.156 4/4, t=+5.00, p=0.0154 (per seed +0.125 +0.125 +0.250 +0.125)" in result.stdout
    assert "note: a league.json without per-seed values" in result.stdout


def test_a_report_quoting_two_leagues_and_a_table_of_pairs(written, tmp_path):
    """A report like results/league_agpo.md: a hand-made table of pairs, the league's report with its headings
    one level down, a second league's after it; a bold cell of a table the league does not hold is named."""
    path, md = written
    quoted = md.read_text().replace("\n## ", "\n### ").replace("# CPU testbed league", "## The league's report")
    pairs = ("| scenario | a - b | `c` - `b` | a - c |\n|---|---|---|---|\n"
             "| default | **+0.156 4/4** | -0.016 3/4 | +0.172 4/4 |\n"
             "| six | +0.104 5/6 | **+0.125 6/6** | -0.021 1/6 |\n\n"
             "| R2PO at 150 minus | all |\n|---|---|\n| r2po - GRPO at 90 | **-0.025** 4/4 |\n\n")
    report = tmp_path / "report.md"
    report.write_text("# A report\n\n" + pairs + quoted + "\n" + quoted)
    result = run(path, path, "--md", report)
    assert (result.returncode, result.stderr) == (0, "")
    assert "(10 bold)" in result.stdout  # 4 in each league's matrices, 2 in the table of pairs
    assert f"note: {report}:8: 1 bold cell(s) in the table under 'A report' are not recomputable" in result.stdout
    report.write_text("# A report\n\n" + pairs.replace("**+0.125 6/6**", "+0.125 6/6") + quoted + "\n" + quoted)
    refused = run(path, path, "--md", report)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"{report}:6: six: c - b: not bold, recomputed beyond seed noise (+0.125, 6/6, t=+inf, p=0.0000)"]
    # Two leagues given for a report holding one: the second's tables are missing.
    assert "1 overview table(s) for 2 league(s)" in run(path, path, "--md", md).stderr


def test_refusals(tmp_path):
    (tmp_path / "not.json").write_text("{")
    (tmp_path / "other.json").write_text('{"metric": "success_final"}')
    for name, message in (("not.json", "not readable as JSON"), ("other.json", "not a league.json"),
                          ("absent.json", "not readable as JSON")):
        result = run(tmp_path / name)
        assert result.returncode == 2
        assert result.stderr.startswith(f"league_verdicts: {tmp_path / name}: {message}")
        assert len(result.stderr.splitlines()) == 1


# Every league report of results/ and the league.json files its bold cells come from (results/README.md).
COMMITTED = {
    "league.md": ["league.json"],
    "league_low_lr.md": ["league_low_lr.json"],
    "league_agpo.md": ["league_agpo.json", "league_agpo_ablation.json"],
    "league_agpo_authors.md": ["league_agpo_authors.json"],
    "league_r2po.md": ["league_r2po.json"],
}


def test_every_committed_league_report_is_listed():
    reports = {p.name for p in (ROOT / "results").glob("league*.md")}
    assert reports == set(COMMITTED)


@pytest.mark.parametrize("report", sorted(COMMITTED))
def test_each_committed_league_report_recomputes_from_its_committed_json(report):
    results = ROOT / "results"
    result = run(*(results / name for name in COMMITTED[report]), "--md", results / report)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith(f"{results / report}: every pairwise cell agrees")


def _earlier_report(default: dict[str, str], six: dict[str, str]) -> str:
    """An earlier report of the hand-written league: per scenario a pairwise matrix with the cells given (a - b as
    'a-b'), the rest '+0.000 2/4'."""
    text = []
    for name, cells in (("default", default), ("six", six)):
        text += [f"## {name}: (its overrides)", "", "| row - column | a | b | c |", "|---|---|---|---|"]
        for a in "abc":
            row = [("." if a == b else cells.get(f"{a}-{b}", "+0.000 2/4")) for b in "abc"]
            text.append(f"| {a} | " + " | ".join(row) + " |")
        text.append("")
    return "\n".join(text)


def test_an_earlier_report_against_the_league_json(tmp_path):
    """By hand (the rule's cases above): now default a - b is beyond (+0.156), a - c and b - c within; six c - b
    beyond (+0.125), the rest within. The earlier report said default a - b beyond (+, held), a - c beyond
    (within now), six b - c beyond with b ahead (reversed: c is ahead now)."""
    path = tmp_path / "league.json"
    path.write_text(json.dumps(hand_written()))
    earlier = tmp_path / "earlier.md"
    earlier.write_text(_earlier_report({"a-b": "**+0.100** 4/4", "a-c": "**-0.050** 4/4"},
                                       {"b-c": "**+0.050** 4/4", "a-b": "+0.010 3/6"}))
    result = run(path, "--against", earlier)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"default: a - b: +0.100 (beyond) in {earlier}, +0.156 (beyond) in {path}: held" in lines
    assert f"default: a - c: -0.050 (beyond) in {earlier}, +0.172 in {path}: within" in lines
    assert f"six: b - c: +0.050 (beyond) in {earlier}, -0.125 (beyond) in {path}: reversed" in lines
    assert lines[-1] == (f"{earlier} against {path}: of 3 pair(s) beyond seed noise in {earlier}, 1 held, 1 within "
                         f"seed noise, 1 reversed; 0 beyond seed noise in {path} only")
    two = run(path, path, "--against", earlier)
    assert two.returncode == 2 and two.stderr.strip().endswith("compares one league.json with it, 2 given")
    # Neither verdict bold before: both of today's are new.
    earlier.write_text(_earlier_report({}, {}))
    assert run(path, "--against", earlier).stdout.splitlines()[-1].endswith(f"; 2 beyond seed noise in {path} only")
