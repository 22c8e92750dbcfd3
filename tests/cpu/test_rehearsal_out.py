"""What ``python -m recipe_apo.cpu.rehearse`` refuses before it writes, builds or starts anything: an ``--out`` it
did not make (a user's files there survive), the filesystem root and the home folder, an ``--out`` that is a file,
under a file or read-only, a repeated method, a bad number. Each is one ``recipe-apo: error:`` line, exit status 2.
In-process, without Ray or a model: whatever would start work is replaced by a stub that fails the test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recipe_apo.cpu import make_tiny as mt
from recipe_apo.cpu import rehearse


@pytest.fixture
def no_work(monkeypatch):
    """The tiny model's build and the runs fail the test if reached: a refusal must come first."""

    def started(*args, **kwargs):
        raise AssertionError("the rehearsal started work instead of refusing")

    monkeypatch.setattr("recipe_apo.cpu.make_tiny.make_tiny", started)
    monkeypatch.setattr(rehearse, "run_logged", started)
    monkeypatch.setattr(rehearse, "audit_runs", started)
    return started


def refusal(capsys, *args: str) -> str:
    """The one line of a refused rehearsal (exit status 2)."""
    assert rehearse.main(list(args)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("recipe-apo: error: ")
    return lines[0]


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (p.read_text() if p.is_file() else "/") for p in sorted(root.rglob("*"))}


def test_a_users_files_in_an_out_no_rehearsal_made_survive_and_the_run_is_refused(tmp_path, no_work, capsys):
    # A folder of the user's, with a model and data where the rehearsal puts its tiny ones.
    out = tmp_path / "mine"
    (out / "tiny" / "model").mkdir(parents=True)
    (out / "tiny" / "model" / "model.safetensors").write_text("my weights")
    (out / "tiny" / "data").mkdir()
    (out / "tiny" / "data" / "train.parquet").write_text("my data")
    before = tree(out)
    line = refusal(capsys, "--out", str(out), "--methods", "apo")
    assert line == (f"recipe-apo: error: --out {out} is not empty (tiny) and no rehearsal wrote it (no "
                    f".recipe-apo-rehearsal in it): give another --out (a new or empty folder), or, if nothing in it "
                    f"is needed, remove {out} yourself")
    assert tree(out) == before  # not even the rehearsal's marker

    # An earlier rehearsal's folder (marked) whose tiny/model make_tiny did not make: that folder is refused.
    (out / rehearse.MARKER).write_text("")
    before = tree(out)
    line = refusal(capsys, "--out", str(out), "--methods", "apo")
    assert f"{out / 'tiny' / 'model'} is a folder with files that recipe-apo did not make" in line
    assert line.endswith(f"or remove {out / 'tiny' / 'model'} yourself")
    assert tree(out) == before


def test_a_rehearsal_reruns_into_its_own_folder(tmp_path):
    # What a rehearsal and its make_tiny leave: the runs are cleared, the tiny model kept for make_tiny to replace.
    out = tmp_path / "r"
    for name in ("model", "data"):
        (out / "tiny" / name).mkdir(parents=True)
        (out / "tiny" / name / mt.MADE_MARK).write_text(mt.MADE_TEXT)
    (out / "checkpoints" / "rehearsal").mkdir(parents=True)
    (out / "summary.md").write_text("old")
    (out / rehearse.MARKER).write_text("")
    assert rehearse.prepare_out(out, say=lambda line: None) == out.resolve()
    assert sorted(p.name for p in out.iterdir()) == [rehearse.MARKER, "tiny"]
    mt.check_out_dir(out / "tiny")  # make_tiny may replace its own folders


@pytest.mark.parametrize("where", ["/", "~", "home", "above home", "above the current folder"])
def test_the_root_the_home_folder_and_the_folders_above_them_are_refused(where, no_work, monkeypatch, capsys):
    monkeypatch.setattr(rehearse, "prepare_out", no_work)  # never write into any of them, whatever happens
    home = Path.home().resolve()
    out = {"home": str(home), "above home": str(home.parent),
           "above the current folder": str(Path.cwd().resolve().parent)}.get(where, where)
    line = refusal(capsys, "--out", out, "--methods", "apo")
    # Above home may be the root, above the current folder home: each is named as what it is.
    reason = {"/": "the filesystem root", "~": "your home folder", "home": "your home folder"}.get(where, "")
    assert f": {reason}" in line and ", never a rehearsal's folder" in line and "give --out a folder of its own" in line


def read_only(tmp_path, monkeypatch, emulated: bool) -> Path:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if emulated:  # root writes anyway: a read-only folder as os.access reports it to anyone else
        access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: not (Path(path) == folder and mode & os.W_OK)
                            and access(path, mode, **kw))
    return folder


@pytest.mark.parametrize("kind", [
    "a file", "under a file", "in a read-only folder", "a read-only folder", "read-only (emulated for root)"])
def test_an_out_that_is_a_file_under_a_file_or_read_only_is_one_line(kind, tmp_path, no_work, monkeypatch, capsys):
    if "read-only" in kind and "emulated" not in kind and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders (the emulated case stands in)")
    (tmp_path / "f").write_text("a file")
    ro = read_only(tmp_path, monkeypatch, emulated="emulated" in kind)
    out, expected = {
        "a file": (tmp_path / "f", f"--out {tmp_path / 'f'} is a file, not a folder"),
        "under a file": (tmp_path / "f" / "run", f"--out {tmp_path / 'f' / 'run'}: {tmp_path / 'f'} is a file, not a "
                                                 f"folder"),
        "in a read-only folder": (ro / "run", f"--out {ro / 'run'}: {ro} is not writable for you"),
        "a read-only folder": (ro, f"--out {ro} is not writable for you"),
        "read-only (emulated for root)": (ro / "run", f"--out {ro / 'run'}: {ro} is not writable for you"),
    }[kind]
    before = tree(tmp_path)
    try:
        line = refusal(capsys, "--out", str(out), "--methods", "apo")
    finally:
        ro.chmod(0o755)
    assert line.startswith(f"recipe-apo: error: {expected}") and line.endswith("; give --out a folder you can write")
    assert tree(tmp_path) == before


def test_a_repeated_or_unknown_method_is_refused(tmp_path, no_work, monkeypatch, capsys):
    monkeypatch.setattr(rehearse, "rehearse", no_work)
    line = refusal(capsys, "--out", str(tmp_path / "r"), "--methods", "apo,grpo,apo")
    assert line == ("recipe-apo: error: argument --methods: apo given more than once (its second job would run under "
                    "the first's name and resume its checkpoints); give each method once (see --help)")
    line = refusal(capsys, "--methods", "apo,gspo")
    assert "argument --methods: gspo is not a preset; choose among grpo, drgrpo, apo, codapo" in line
    assert not (tmp_path / "r").exists()
    # Called as a function too.
    with pytest.raises(rehearse.RehearsalRefused, match="^--methods apo,apo: apo given more than once"):
        rehearse.check_methods(["apo", "apo"])


@pytest.mark.parametrize("args, said", [
    (["--steps", "0"], "argument --steps: must be between 1 and 100000, got '0'"),
    (["--steps", "-1"], "argument --steps: must be between 1 and 100000, got '-1'"),
    (["--steps", "9" * 5000], "argument --steps: expected a whole number of steps, got '" + "9" * 37 + "'..."),
    (["--steps", "9" * 30], "argument --steps: must be between 1 and 100000, got '" + "9" * 30 + "'"),
    (["--steps", "abc"], "argument --steps: expected a whole number of steps, got 'abc'"),
    (["--steps", "1.5"], "argument --steps: expected a whole number of steps, got '1.5'"),
    (["--engine", "sglang"], "argument --engine: invalid choice: 'sglang'"),
    (["--out"], "argument --out: expected one argument"),
    (["--stpes", "3"], "unrecognized arguments: --stpes 3"),
], ids=lambda value: " ".join(value)[:20] if isinstance(value, list) else "")
def test_a_bad_argument_is_one_line(args, said, no_work, monkeypatch, capsys):
    monkeypatch.setattr(rehearse, "rehearse", no_work)
    line = refusal(capsys, *args)
    assert line.startswith(f"recipe-apo: error: {said}") and line.endswith("(see --help)")
