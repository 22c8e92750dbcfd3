"""The audit treats a dump, and its command line, as untrusted input: whatever it is given ends in a
report without a NaN, or in one line ``recipe-apo audit: error: ...`` naming the file:line and field, or the
argument, at fault, with exit code 2 and nothing written into ``--out``.

Most tests go through the command's entry point, ``recipe_apo.audit.__main__.main``, as a user would; the
rules for a row's fields also hold for every value and position (hypothesis).
"""

import json
import math
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recipe_apo.audit.__main__ import main
from recipe_apo.audit.analysis import audit_run
from recipe_apo.audit.dumps import MAX_LENGTH, MAX_STEP, AuditError, load_run, read_step
from recipe_apo.audit.report import audit_folders

# A step of two groups of four, with every field the recipe's trainer writes.
SCORES = ((1.0, 0.0, 0.0, 0.0), (1.0, 1.0, 0.0, 0.0))
ROOT = Path(__file__).resolve().parents[2]


def step_rows(step: int = 1, scores=SCORES, data_source: bool = True) -> list[dict]:
    rows = []
    for g, group in enumerate(scores):
        for r, score in enumerate(group):
            row = {"input": f"prompt {g}", "output": "w " * (r + 2), "gts": "x", "score": score, "step": step,
                   "uid": f"s{step}g{g}_{r}_0", "response_length": r + 2, "truncated": 0.0, "advantage": 0.0,
                   "apo_phi": 1.5, "apo_anchor": 0.5}
            if data_source:
                row["data_source"] = "toy"
            rows.append(row)
    return rows


def write(folder: Path, files: dict[str, list]) -> Path:
    """``files``: file name -> its lines, each a row (dict, written as JSON) or the line's raw text."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        text = "".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def refused(capsys, argv: list, out: Path) -> str:
    """Run the command; assert it refused in one line (progress lines aside), wrote nothing, and return the
    line's message."""
    rc = main([str(a) for a in argv] + ["--out", str(out), "--no-plot"])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if not line.startswith("[")]  # "[1/2] run: ..." is progress
    assert rc == 2 and len(said) == 1, err
    assert said[0].startswith("recipe-apo audit: error: ") and "Traceback" not in err
    assert not out.exists()
    return said[0].removeprefix("recipe-apo audit: error: ")


# ---- a bad field, file or argument, each through the command ----------------------------------------------------


@pytest.mark.parametrize("value", [None, -5, "abc"], ids=["null", "negative", "string"])
def test_a_length_that_is_not_a_token_count_is_refused_naming_its_line(tmp_path, capsys, value):
    rows = step_rows()
    rows[2]["response_length"] = value  # line 3
    run = write(tmp_path / "run", {"1.jsonl": rows})
    message = refused(capsys, [run], tmp_path / "out")
    assert message == (f"{run}/1.jsonl:3: response_length {json.dumps(value)} is not a whole number of tokens "
                       "from 0 to 2^53")


@pytest.mark.parametrize(("field", "value", "wanted"), [
    ("truncated", "yes", "true or false (or 1 or 0)"),
    ("advantage", "x", "a finite number"),
])
def test_a_flag_or_an_advantage_that_is_a_string_is_refused_naming_its_line(tmp_path, capsys, field, value, wanted):
    rows = step_rows()
    rows[5][field] = value
    run = write(tmp_path / "run", {"1.jsonl": rows})
    assert refused(capsys, [run], tmp_path / "out") == f"{run}/1.jsonl:6: {field} {json.dumps(value)} is not {wanted}"


def test_two_files_of_one_step_are_refused_naming_both(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows(), "01.jsonl": step_rows(), "2.jsonl": step_rows(2)})
    assert refused(capsys, [run], tmp_path / "out") == f"{run}: 01.jsonl and 1.jsonl are both step 1; keep one of them"


def test_a_byte_that_is_not_utf8_is_refused_naming_its_line(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    lines = (run / "1.jsonl").read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"prompt", b"pr\xffompt")
    (run / "1.jsonl").write_bytes(b"".join(lines))
    column = lines[3].index(b"\xff") + 1
    assert refused(capsys, [run], tmp_path / "out") == f"{run}/1.jsonl:4: not UTF-8 text (byte 0xff at column {column})"


def test_a_folder_named_like_a_step_file_is_refused(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    (run / "7.jsonl").mkdir()
    assert refused(capsys, [run], tmp_path / "out") == f"{run}/7.jsonl: a folder, not a file"


def test_out_naming_a_file_or_a_path_under_one_is_refused_before_the_dump_is_read(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    taken = tmp_path / "taken"
    taken.write_text("mine")
    rc = main([str(run), "--out", str(taken)])
    assert rc == 2 and capsys.readouterr().err == f"recipe-apo audit: error: --out {taken}: a file, not a folder\n"
    rc = main([str(run), "--out", str(taken / "report")])
    assert rc == 2 and capsys.readouterr().err.splitlines() == [
        f"recipe-apo audit: error: --out {taken / 'report'}: {taken} is a file, not a folder"]
    assert taken.read_text() == "mine"


def test_a_tokenizer_folder_that_does_not_exist_is_refused(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    message = refused(capsys, [run, "--tokenizer", tmp_path / "no-such-model"], tmp_path / "out")
    assert message.startswith(f"--tokenizer {tmp_path / 'no-such-model'}: no such folder, nor a model id that loads")


def test_a_tokenizer_folder_without_a_tokenizer_is_refused(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    (tmp_path / "empty-model").mkdir()
    message = refused(capsys, [run, "--tokenizer", tmp_path / "empty-model"], tmp_path / "out")
    assert message.startswith(f"--tokenizer {tmp_path / 'empty-model'}: no tokenizer loads from it (")


def test_a_replay_by_data_source_names_the_rows_without_one(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows(data_source=False), "2.jsonl": step_rows(2)})
    message = refused(capsys, [run, "--apo", "anchor_scope=data_source"], tmp_path / "out")
    assert message == (f"{run}/1.jsonl:1: no data_source field, which --apo anchor_scope=data_source needs "
                       "(8 rows in 1 of the run's 2 step files lack it)")
    assert "verl does not pass" not in message


def test_a_replay_by_data_source_names_a_group_that_mixes_sources(tmp_path, capsys):
    rows = step_rows()
    rows[6]["data_source"] = "other"  # group 1's third response
    run = write(tmp_path / "run", {"1.jsonl": rows})
    message = refused(capsys, [run, "--apo", "anchor_scope=data_source"], tmp_path / "out")
    assert message == (f'{run}/1.jsonl:7: data_source "other" in a prompt group whose line 5 has "toy"; '
                       "--apo anchor_scope=data_source needs one data_source per group")


def test_a_run_no_replay_reproduces_reads_none_and_the_docs_say_why(tmp_path, capsys):
    # Advantages of no preset: the replay cannot tell the run's method (CoDaPO's weighted ones, for one).
    rows = step_rows()
    for row, advantage in zip(rows, (0.6, -0.2, -0.2, -0.2, 0.4, 0.4, -0.4, -0.4)):
        row["advantage"] = advantage
    run = write(tmp_path / "run", {"1.jsonl": rows})
    out = tmp_path / "out"
    assert main([str(run), "--out", str(out), "--no-plot"]) == 0
    assert json.loads((out / "audit.json").read_text())[0]["logged"]["matches"] == []
    assert "| run | none |" in (out / "report.md").read_text()
    docs = (ROOT / "docs" / "audit.md").read_text()
    note = next(par for par in docs.split("\n\n") if "`none`" in par)
    assert "CoDaPO" in note


# ---- every field of a row: its rule, for any value and any position -------------------------------------------

NON_NUMBERS = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.sampled_from([math.nan, math.inf, -math.inf]),
                        st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                                  max_size=1))
FRACTIONS = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())
CORRUPT = {
    "score": NON_NUMBERS,
    "advantage": NON_NUMBERS,
    "apo_phi": NON_NUMBERS,
    "apo_anchor": NON_NUMBERS,
    "response_length": st.one_of(NON_NUMBERS, st.integers(max_value=-1), FRACTIONS,
                                 st.integers(min_value=MAX_LENGTH + 1), st.just(10**400)),
    "truncated": st.one_of(NON_NUMBERS.filter(lambda v: not isinstance(v, bool)), FRACTIONS,
                           st.integers().filter(lambda v: v not in (0, 1))),
    "step": st.one_of(NON_NUMBERS, FRACTIONS, st.integers().filter(lambda v: v != 2)),
    "output": st.one_of(st.none(), st.integers(), st.lists(st.text(max_size=2), max_size=2)),
    "uid": st.one_of(st.none(), st.integers(), st.text(alphabet="ab_", max_size=5)),
    "data_source": st.one_of(st.none(), st.integers(), st.booleans()),
    "input": st.one_of(st.none(), st.integers(), st.booleans()),
    # At step 2 a lag is 0 or 1 (the step trains weight version 1); null is refused too (not a padding row).
    "policy_lag": st.one_of(NON_NUMBERS, st.integers(max_value=-1), FRACTIONS, st.integers(min_value=2),
                            st.floats(min_value=2, allow_nan=False)),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(CORRUPT)), data=st.data(), row=st.integers(0, 7),
       blank=st.lists(st.integers(0, 8), max_size=3))
def test_a_row_with_any_field_broken_anywhere_is_refused_naming_its_line_and_field(tmp_path_factory, field, data,
                                                                                    row, blank):
    value = data.draw(CORRUPT[field], label="value")
    rows = step_rows(2)
    if field == "policy_lag":  # a field of every row or of none: the others carry a valid lag
        for other in rows:
            other["policy_lag"] = 1
    rows[row][field] = value
    lines: list = list(rows)
    for position in sorted(blank, reverse=True):
        lines.insert(position, "")  # blank lines are skipped, and counted
    line = lines.index(rows[row]) + 1
    folder = write(tmp_path_factory.mktemp("dump"), {"2.jsonl": lines})
    with pytest.raises(AuditError) as refusal:
        read_step(folder / "2.jsonl", 2)
    message = str(refusal.value)
    assert message.startswith(f"{folder}/2.jsonl:{line}: {field} ") and "\n" not in message


def test_a_large_integer_length_is_not_rounded_into_range(tmp_path):
    rows = step_rows()
    rows[0]["response_length"] = MAX_LENGTH  # the largest accepted; one more would round to it as a float
    assert read_step(write(tmp_path, {"1.jsonl": rows}) / "1.jsonl", 1).logged_lengths[0] == MAX_LENGTH


def test_flags_as_the_trainer_writes_them_or_as_json_booleans_read_alike(tmp_path):
    as_floats, as_booleans = step_rows(), step_rows()
    for i, (a, b) in enumerate(zip(as_floats, as_booleans)):
        a["truncated"], b["truncated"] = float(i % 3 == 0), i % 3 == 0
    first = read_step(write(tmp_path / "a", {"1.jsonl": as_floats}) / "1.jsonl", 1).logged_truncated
    second = read_step(write(tmp_path / "b", {"1.jsonl": as_booleans}) / "1.jsonl", 1).logged_truncated
    assert first.dtype == bool and first.tolist() == second.tolist() == [i % 3 == 0 for i in range(8)]


@pytest.mark.parametrize(("change", "expected"), [
    (lambda rows: rows[3].pop("advantage"), "1.jsonl:4: no advantage field, which line 1 has"),
    (lambda rows: rows[0].pop("truncated"), "1.jsonl:2: a truncated field, which line 1 has not"),
    (lambda rows: rows[5].update(uid=rows[1]["uid"]), '1.jsonl:6: uid "s1g0_1_0" again (first on line 2)'),
    (lambda rows: rows[4].update(step=3), "1.jsonl:5: step 3 is not the file's step 1"),
    (lambda rows: [row.pop(key) for row in rows for key in ("uid", "input")],
     "1.jsonl:1: neither a uid nor an input field"),
], ids=["field-missing", "field-extra", "uid-twice", "other-step", "no-groups"])
def test_rows_that_do_not_belong_together_are_refused(tmp_path, change, expected):
    rows = step_rows()
    change(rows)
    folder = write(tmp_path, {"1.jsonl": rows})
    with pytest.raises(AuditError, match=f"^{folder}/{expected}".replace("(", r"\(").replace(")", r"\)")):
        load_run(folder)


# ---- numbers: typed and bounded where read, before anything is sized or converted by them ---------------------


def refused_quickly(capsys, argv: list, out: Path) -> str:
    """``refused``, in milliseconds and without a large allocation (numpy's arrays are traced too)."""
    tracemalloc.start()
    try:
        start = time.perf_counter()
        message = refused(capsys, argv, out)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5 and peak < 32 * 2**20, (elapsed, peak)
    return message


BEYOND_A_STEP = "is more than step {step} allows (at most {most}: step {step} trains weight version {most}, and " \
                "versions start at 0)"
NOT_A_LAG = "is not a whole number of weight versions from 0 to 2^53 (null on verl's padding rows only)"


@pytest.mark.parametrize(("lag", "written", "expected"), [
    (10**9, "1000000000", BEYOND_A_STEP),  # was a bincount of 7 GiB
    (1e12, "1000000000000.0", BEYOND_A_STEP),  # of 7 TiB
    (3, "3", BEYOND_A_STEP),  # step 3 trains version 2: 3 versions back is before the run's first
    (2**63, "9223372036854775808", NOT_A_LAG),  # was an OverflowError into an int64 array
    (1e300, "1e+300", NOT_A_LAG),  # likewise
    (10**400, "1" + "0" * 36 + "...", NOT_A_LAG),  # an int no float holds
], ids=["1e9", "1e12", "step", "2^63", "1e300", "1e400-int"])
def test_a_policy_lag_no_response_of_its_step_can_have_is_refused_at_once_naming_its_line(tmp_path, capsys, lag,
                                                                                           written, expected):
    rows = step_rows(3)
    for row in rows:
        row["policy_lag"] = 0
    rows[6]["policy_lag"] = lag  # line 7
    run = write(tmp_path / "run", {"3.jsonl": rows})
    message = refused_quickly(capsys, [run], tmp_path / "out")
    assert message == f"{run}/3.jsonl:7: policy_lag {written} " + expected.format(step=3, most=2)


# "huge": beyond float64 for a float, beyond int64 (yet a float) for a whole number.
HOSTILE = {"huge": 10**400, "huge-whole": 2**63, "negative": -1, "fraction": 0.5, "nan": math.nan, "inf": math.inf,
           "string": "1", "bool": True, "null": None}
# Each field the audit reads as a number, and the hostile kinds it takes as they are (a score of -1 is a number;
# the success rule refuses it later, naming the row; a flag may be true; a lag null on a padding row).
NUMBER_FIELDS = {
    "score": ("huge", "nan", "inf", "string", "bool", "null"),
    "advantage": ("huge", "nan", "inf", "string", "bool", "null"),
    "apo_phi": ("huge", "nan", "inf", "string", "bool", "null"),
    "apo_anchor": ("huge", "nan", "inf", "string", "bool", "null"),
    "response_length": tuple(HOSTILE),
    "truncated": ("huge", "negative", "fraction", "nan", "inf", "string", "null"),
    "step": tuple(HOSTILE),
    "policy_lag": tuple(HOSTILE),
}


@pytest.mark.parametrize(("field", "kind"), [(f, k) for f, kinds in NUMBER_FIELDS.items() for k in kinds],
                         ids=lambda v: v)
def test_every_number_field_with_a_hostile_value_is_refused_naming_its_file_line_and_field(tmp_path, field, kind):
    rows = step_rows(2)
    for row in rows:
        row["policy_lag"] = 1
    rows[4][field] = HOSTILE[kind]  # line 5
    folder = write(tmp_path, {"2.jsonl": rows})
    with pytest.raises(AuditError) as refusal:
        load_run(folder)
    message = str(refusal.value)
    assert message.startswith(f"{folder}/2.jsonl:5: {field} ") and "\n" not in message and len(message) < 300


@pytest.mark.parametrize("step", [MAX_STEP + 1, 10**30, int("9" * 200)], ids=["2^53+1", "1e30", "200-digits"])
def test_a_step_file_named_beyond_2_53_is_refused_naming_it(tmp_path, capsys, step):
    rows = [{**row, "step": step} for row in step_rows()]
    run = write(tmp_path / "run", {f"{step}.jsonl": rows, "1.jsonl": step_rows()})
    message = refused(capsys, [run], tmp_path / "out")
    name, digits = f"{step}.jsonl", str(step)
    shown = (name if len(name) <= 40 else name[:37] + "...", digits if len(digits) <= 40 else digits[:37] + "...")
    assert message.startswith(f"{run}/{shown[0]}: step {shown[1]} is beyond 2^53, more steps than any run has")


def test_a_rows_step_is_not_rounded_into_its_files_step(tmp_path):
    rows = step_rows(MAX_STEP)
    rows[2]["step"] = MAX_STEP + 1  # as a float, 2^53 + 1 is 2^53: the file's step
    folder = write(tmp_path, {f"{MAX_STEP}.jsonl": rows})
    with pytest.raises(AuditError, match=f"^{folder}/{MAX_STEP}.jsonl:3: step {MAX_STEP + 1} is not a whole number "
                                         "from 0 to 2\\^53$"):
        load_run(folder)


@pytest.mark.parametrize(("index", "shown"), [("8", "8"), ("9" * 5000, "9" * 37 + "...")], ids=["rows", "5000-digits"])
def test_a_uid_output_index_beyond_the_steps_rows_is_refused_naming_its_line(tmp_path, capsys, index, shown):
    rows = step_rows()
    rows[1]["uid"] = f"s1g0_1_{index}"  # 8 rows: a trajectory has at most 8 outputs, 0 to 7
    run = write(tmp_path / "run", {"1.jsonl": rows})
    uid = json.dumps(rows[1]["uid"])
    assert refused_quickly(capsys, [run], tmp_path / "out") == (
        f"{run}/1.jsonl:2: uid {uid if len(uid) <= 40 else uid[:37] + '...'} has output index {shown}, beyond the "
        "step's 8 rows (verl numbers a trajectory's outputs 0, 1, ... and dumps each one)")


def test_lags_of_a_late_step_are_measured_without_an_array_as_long_as_the_lag(tmp_path):
    # The largest step and lag the audit takes: its staleness is summed per lag, not over 0 .. the largest lag.
    rows = step_rows(MAX_STEP)
    for i, row in enumerate(rows):
        row["policy_lag"] = (MAX_STEP - 1) * (i % 2)
    run = load_run(write(tmp_path / "late", {f"{MAX_STEP}.jsonl": rows}))
    audit_run(load_run(write(tmp_path / "warm", {"1.jsonl": step_rows()})))  # the replay's first-use imports
    tracemalloc.start()
    try:
        start = time.perf_counter()
        result = audit_run(run)
        elapsed, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0 and peak < 32 * 2**20, (elapsed, peak)
    assert result["staleness"]["response_share"] == {0: 0.5, MAX_STEP - 1: 0.5}


def test_a_length_that_would_size_the_replays_mask_beyond_its_bound_is_refused_at_once_naming_its_line(tmp_path,
                                                                                                     capsys):
    from recipe_apo.integration.replay import MAX_MASK_CELLS

    # The replays lay a step out as a mask of its responses times its longest response's tokens (AGPO reads each
    # response's length): 8 responses of up to 2^25 tokens fill the bound; one token more is refused.
    audit_run(load_run(write(tmp_path / "warm", {"1.jsonl": step_rows()})))  # the replay's first-use imports
    for length in (MAX_LENGTH, MAX_MASK_CELLS // 8 + 1):
        rows = step_rows()
        rows[5]["response_length"] = length  # line 6
        run = write(tmp_path / f"run{length}", {"1.jsonl": rows})
        assert refused_quickly(capsys, [run], tmp_path / "out") == (
            f"{run}/1.jsonl:6: a response of length {length}: the replay would lay the step's 8 responses out as a "
            f"mask of 8 x {length} tokens, beyond the {MAX_MASK_CELLS} cells it allocates")


@pytest.mark.parametrize(("args", "expected"), [
    (["--max-response-length", str(10**30)],
     "argument --max-response-length: must be at most 2^53 (no response is longer), got 1000000000000000000000000000000"
     " (see --help)"),
    (["--max-response-length", "9" * 5000],
     "argument --max-response-length: must be at most 2^53 (no response is longer), got " + "9" * 37
     + "... (see --help)"),
    (["--max-response-length", str(MAX_LENGTH)], "no policy_lag"),  # the largest cap taken: the dump is read
    (["--apo", "history=" + "9" * 5000],
     "--apo 'history=9999999999999999999999999999...: 5008 characters, longer than any KEY=VALUE of algorithm.apo "
     "(at most 200)"),
    (["--apo", "eta=" + "[" * 98 + "]" * 98], "--apo: algorithm.apo.eta must be a finite number, got [[[[[[[["),
], ids=["cap-1e30", "cap-5000-digits", "cap-2^53", "apo-5000-digits", "apo-nested"])
def test_a_number_argument_beyond_its_bound_is_refused_in_one_short_line(tmp_path, capsys, args, expected):
    rows = step_rows()
    for row in rows[1:]:
        row["policy_lag"] = 0  # the first row lacks it: an error once the dump is read
    run = write(tmp_path / "run", {"1.jsonl": rows})
    message = refused(capsys, [run, *args], tmp_path / "out")
    assert message.startswith(expected if expected != "no policy_lag" else f"{run}/1.jsonl:2: a policy_lag field")
    assert len(message) < 300


@pytest.mark.parametrize("cap", [0, 2**60, 1.5, True, "8"], ids=repr)
def test_audit_folders_takes_the_command_lines_cap_only(tmp_path, cap):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    with pytest.raises(AuditError, match="^--max-response-length must be a whole number of tokens from 1 to 2\\^53"):
        audit_folders([run], tmp_path / "out", max_response_length=cap)


# ---- the files themselves ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "1.jsonl: no responses (an empty step file"),
    (b"\n\n", "1.jsonl: no responses (an empty step file"),
    (b'{"output": "a", "score": 1.0, "uid": "a_0_0"}\n{"output": "b", "sco', "1.jsonl:2: the last line is cut short"),
    (b'{"output": "a", "score": 1.0, "uid": "a_0_0"}\nnot json\n', "1.jsonl:2: not JSON ("),
    (b"[" * 100_000 + b"\n", "1.jsonl:1: not JSON (nested too deeply)"),
    (b'[{"output": "a", "score": 1.0}]\n', "1.jsonl:1: a JSON array, not an object"),
    (b'{"output": "a"}\n', "1.jsonl:1: no score field"),
], ids=["empty", "blank", "cut-short", "not-json", "too-deep", "array", "no-score"])
def test_a_step_file_a_writer_left_broken_is_refused_naming_it(tmp_path, content, expected):
    (tmp_path / "1.jsonl").write_bytes(content)
    with pytest.raises(AuditError) as refusal:
        load_run(tmp_path)
    assert str(refusal.value).startswith(f"{tmp_path}/{expected}")


def test_blank_lines_are_skipped_and_lines_keep_their_numbers(tmp_path):
    rows = step_rows()
    folder = write(tmp_path, {"1.jsonl": ["", rows[0], "   ", *rows[1:], ""]})
    step = load_run(folder).steps[0]
    assert len(step.scores) == 8 and step.lines.tolist() == [2, *range(4, 11)]


def test_a_step_file_that_cannot_be_opened_is_refused_naming_it(tmp_path):
    write(tmp_path, {"1.jsonl": step_rows()})
    (tmp_path / "2.jsonl").symlink_to(tmp_path / "gone.jsonl")  # a dangling link: the file went away
    with pytest.raises(AuditError, match=f"^{tmp_path}/2.jsonl: cannot be read \\(No such file or directory\\)$"):
        load_run(tmp_path)


def test_only_ascii_step_numbers_name_step_files(tmp_path):
    write(tmp_path, {"1.jsonl": step_rows(), "\u00b2.jsonl": ["not a dump"], "val.jsonl": ["not a dump"]})
    assert [step.step for step in load_run(tmp_path).steps] == [1]


# ---- the command line ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "expected"), [
    (["--max-response-length", "0"], "argument --max-response-length: must be >= 1, got 0 (see --help)"),
    (["--max-response-length", "-3"], "argument --max-response-length: must be >= 1, got -3 (see --help)"),
    (["--max-response-length", "ten"],
     "argument --max-response-length: expected a whole number of tokens, got 'ten' (see --help)"),
    (["--name", "a", "--name", "b"],
     "--name given 2 times for 1 RUN_DIRs: give one per RUN_DIR, in their order, or none"),
    (["--name", ""], "--name: an empty name"),
    (["--apo", "lambda_sacle=2"], "--apo: unknown setting algorithm.apo.lambda_sacle; known settings: "),
    (["--apo", "reweight='false'"], "--apo: algorithm.apo.reweight must be true or false, got 'false'"),
    (["--apo", "lambda_scale=1e39"], "--apo: algorithm.apo.lambda_scale must be a number in (0, 1000], got 1e+39"),
    (["--apo", "eta=0.5", "--apo", "algorithm.apo.eta=1"], "--apo eta given twice"),
    (["--apo", "eta=0.1,0.2"], "--apo 'eta=0.1,0.2': expected one KEY=VALUE"),
    (["--apo", "eta"], "--apo 'eta': expected KEY=VALUE, e.g. --apo lambda_scale=2.0"),
    (["--apo", "=2"], "--apo '=2': expected one KEY=VALUE"),
    (["--bogus"], "unrecognized arguments: --bogus (see --help)"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_argument_is_refused_in_one_line_before_any_dump_is_read(tmp_path, capsys, args, expected):
    run = write(tmp_path / "run", {"1.jsonl": ['{"broken": ']})  # read first, this would be the error
    assert refused(capsys, [run, *args], tmp_path / "out").startswith(expected)


def test_apo_values_are_read_as_on_verls_command_line(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    out = tmp_path / "out"
    assert main([str(run), "--out", str(out), "--no-plot", "--apo", "eta=1e-1", "--apo", "reweight=false"]) == 0
    replayed = json.loads((out / "audit.json").read_text())[0]["apo_settings"]
    assert replayed["eta"] == 0.1 and replayed["reweight"] is False  # YAML would read 1e-1 as a string


def test_two_runs_of_one_name_are_refused(tmp_path, capsys):
    first = write(tmp_path / "a" / "exp" / "rollouts", {"1.jsonl": step_rows()})
    second = write(tmp_path / "b" / "exp", {"1.jsonl": step_rows()})
    assert refused(capsys, [first.parent, second], tmp_path / "out") == (
        f"two runs are named 'exp' ({first} and {second}): name them apart with --name, once per RUN_DIR")


def test_scores_beyond_float32_are_refused_naming_the_row(tmp_path, capsys):
    rows = step_rows()
    rows[4]["score"] = 1e39  # finite in the dump, inf in the float32 verl computes advantages in
    run = write(tmp_path / "run", {"1.jsonl": rows})
    message = refused(capsys, [run, "--apo", "success=threshold"], tmp_path / "out")
    assert message == (f"{run}/1.jsonl:5: GRPO's replayed advantage is not a finite number (nor are 3 more of "
                       "the step's): scores up to 1e+39 overflow the float32 verl computes advantages in")


def test_scores_the_success_rule_does_not_take_are_refused_naming_the_row(tmp_path, capsys):
    rows = step_rows()
    rows[1]["score"] = 3.0
    run = write(tmp_path / "run", {"1.jsonl": rows})
    message = refused(capsys, [run], tmp_path / "out")
    assert message.startswith(f"{run}/1.jsonl:2: score 3 is outside the rewards algorithm.apo.success=binary "
                              "takes (1 of the step's rows); replay with --apo success=threshold")


# ---- any valid dump: a report without NaN ---------------------------------------------------------------------

GROUPS = st.lists(st.lists(st.tuples(st.sampled_from([0.0, 0.25, 1.0]), st.integers(0, 12)), min_size=1, max_size=4),
                  min_size=1, max_size=3)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(GROUPS, min_size=1, max_size=3), recipe_fields=st.booleans(), flags_as_floats=st.booleans())
def test_any_valid_dump_gives_a_report_without_nan(tmp_path_factory, steps, recipe_fields, flags_as_floats):
    folder = tmp_path_factory.mktemp("run")
    for step, groups in enumerate(steps, 1):
        rows = []
        for g, group in enumerate(groups):
            for r, (score, length) in enumerate(group):
                row = {"input": f"p{g}", "output": "w" * length, "score": score, "step": step}
                if recipe_fields:  # lengths of 0 included: a response of no token
                    truncated = length >= 10
                    row.update(uid=f"{step}-{g}_{r}_0", response_length=length, data_source="toy",
                               truncated=float(truncated) if flags_as_floats else truncated)
                rows.append(row)
        write(folder, {f"{step}.jsonl": rows})
    out = tmp_path_factory.mktemp("out")
    scope = ["--apo", "anchor_scope=data_source"] if recipe_fields else []  # a plain verl dump has no sources
    assert main([str(folder), "--out", str(out), "--no-plot", *scope]) == 0

    def refuse(constant):
        raise AssertionError(f"{constant} in audit.json")

    numbers = json.loads((out / "audit.json").read_text(), parse_constant=refuse)
    assert len(numbers[0]["steps"]) == len(steps)
    assert "nan" not in (out / "report.md").read_text().lower()


def test_a_step_of_empty_responses_carries_no_update(tmp_path):
    rows = step_rows()
    for row in rows:
        row["response_length"] = 0
    result = audit_run(load_run(write(tmp_path, {"1.jsonl": rows})))
    for shares in result["steps"][0]["methods"].values():
        assert [shares[c] for c in ("short_correct", "long_correct", "short_wrong", "long_wrong")] == [0.0] * 4
    assert result["steps"][0]["dead_token_share"] == 0.0 and np.isfinite(result["scale"]["GRPO"]["max"])


# ---- as a program: one line, no traceback ----------------------------------------------------------------------


def test_the_program_on_a_bad_dump_says_one_line_and_no_traceback(tmp_path):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    (run / "1.jsonl").write_bytes((run / "1.jsonl").read_bytes() + b'{"output": "\xff"}\n')
    result = subprocess.run([sys.executable, "-m", "recipe_apo.audit", str(run), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"recipe-apo audit: error: {run}/1.jsonl:9: not UTF-8 text (byte 0xff at column 13)"]
    assert not (tmp_path / "out").exists()


def test_a_run_name_is_text_to_the_figure_and_the_tables(tmp_path, capsys):
    run = write(tmp_path / "run", {"1.jsonl": step_rows()})
    out, name = tmp_path / "out", "a|b $\\frac{c$"  # no TeX for matplotlib, no cell break for markdown
    assert main([str(run), "--out", str(out), "--name", name]) == 0, capsys.readouterr().err
    assert (out / "audit.png").stat().st_size > 10_000
    assert "| a\\|b $\\frac{c$ | 1 | 8 |" in (out / "report.md").read_text()
