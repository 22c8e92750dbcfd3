"""The rollouts verl dumps with ``trainer.rollout_data_dir=DIR``: one ``DIR/<step>.jsonl`` per training step.

Each line holds verl's fields ``input``, ``output`` (both decoded without special tokens), ``gts``, ``score``
and ``step``; verl's V1 trainer adds ``uid`` = ``{sample}_{rollout}_{output}``, whose ``{sample}`` is the prompt
group. The recipe's trainer adds, without touching verl's fields: ``response_length`` (tokens),
``advantage`` (what the loss used), ``data_source``, ``truncated`` (reached the cap without an end token) and,
for APO, ``apo_phi`` (Phi_i as computed; ``lambda_scale`` where the centered reward is 0, which the advantage
ignores) and ``apo_anchor`` (C_t of the response's scope). A dump without ``uid`` (verl's legacy trainer) is
grouped by prompt text within each step. verl's padding rows (uid ``pad...``) are left out, and a multi-output
trajectory is one response, its final output, with the lengths of all its outputs. ``policy_lag`` (verl's
staleness of the response, in weight versions: asynchronous trainers) is read when every step has it.

Lengths: the dump's ``response_length`` if every row has one; else the output re-tokenized with the model's
tokenizer (``tokenizer``); else characters, and the report says so. The replays read each response's length as
its estimator did (``Step.estimator_lengths``: AGPO's length bonus): with the dump's lengths, exactly (a
multi-output trajectory's final output's tokens, the row its estimator read); else the estimate above, at least
1 (verl decodes without special tokens, so an empty output may still have had its end token).

A dump is untrusted input: every field the audit reads has a rule (``FIELDS``) checked as the row is read, and
a row that breaks one is refused naming ``file:line`` and the field, as is a step whose rows do not all carry
the same fields, a uid written twice, a row whose ``step`` is not its file's, and two files of one step. Every
number is typed and bounded before anything is made from it: whole numbers are whole, floats finite, and counts
within what the dump itself can justify (a step number below 2^53, a policy lag below the step, an output index
below the step's row count), so that no untrusted number sizes an allocation or overflows a conversion.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from recipe_apo.errors import RecipeError
from recipe_apo.integration.jsonl import read_rows


class AuditError(RecipeError, ValueError):
    """A dump or an argument the audit cannot use; the message is one line naming the file (and line), or the
    argument, at fault."""


LENGTH_UNITS = {"dump": "tokens", "tokenizer": "tokens (re-tokenized)", "characters": "characters"}
# Lengths above it are not whole numbers in float64 any more; no response is that long.
MAX_LENGTH = 2**53
# Step numbers (a file's name, a row's step) above it are not whole numbers in float64 any more: the figure's
# axis and most readers of audit.json hold them as floats. No run has that many steps (a step a microsecond
# would take 285 years), and a policy lag, below its step, is bounded with it.
MAX_STEP = 2**53

_BAD = object()  # what a field's rule returns for a value that breaks it


def _text(value: Any) -> Any:
    return value if isinstance(value, str) else _BAD


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # JSON true is a Python int
        return _BAD
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float64
        return _BAD
    return number if math.isfinite(number) else _BAD


def _whole(value: Any, high: int) -> Any:
    """``value`` as an int when it is a whole number (``3`` or ``3.0``, not ``true``) from 0 to ``high``. The
    bounds apply to the value as written, before any conversion: 2^53 + 1 as a float would be 2^53, and
    ``int(1e300)`` a 1000-bit integer that no int64 array holds."""
    if isinstance(value, bool):  # JSON true is a Python int
        return _BAD
    if isinstance(value, int):
        return value if 0 <= value <= high else _BAD
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and 0 <= value <= high:
        return int(value)
    return _BAD


def _length(value: Any) -> Any:
    # 0 is legitimate: a response of no token (an aborted generation) carries no update, and the audit says so.
    length = _whole(value, MAX_LENGTH)
    return _BAD if length is _BAD else float(length)


def _step(value: Any) -> Any:
    # Checked again against the file's step (a file's name is never a negative number), in read_step.
    return _whole(value, MAX_STEP)


def _lag(value: Any) -> Any:
    # verl's staleness in weight versions; null on its padding rows (they carry no versions), left out below.
    # Bounded by the file's step in read_step (_check_lag): the type bound here only keeps the number an int64.
    if value is None:
        return None
    return _whole(value, MAX_STEP)


def _flag(value: Any) -> Any:
    # The recipe's trainer writes its flags as floats (0.0 and 1.0); JSON true and false are as good.
    if isinstance(value, bool):
        return value
    return bool(value) if _number(value) in (0.0, 1.0) else _BAD


_UID = re.compile(r"(.+)_([0-9]+)_([0-9]+)", re.DOTALL)


def _uid(value: Any) -> Any:
    # verl's V1 key {sample}_{rollout}_{output} (verl itself reads the last two as integers).
    return value if isinstance(value, str) and _UID.fullmatch(value) else _BAD


# Every field the audit reads: the rule its value must pass (the value as the audit keeps it, or _BAD) and what
# the rule asks, for the error. Fields it does not read (gts, codapo_weight, ...) are left as they are.
FIELDS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "output": (_text, "a string"),
    "score": (_number, "a finite number"),
    "step": (_step, "a whole number from 0 to 2^53"),
    "uid": (_uid, "verl's uid {sample}_{rollout}_{output}"),
    "input": (_text, "a string"),
    "data_source": (_text, "a string"),
    "response_length": (_length, "a whole number of tokens from 0 to 2^53"),
    "truncated": (_flag, "true or false (or 1 or 0)"),
    "advantage": (_number, "a finite number"),  # the trainer writes the float the loss used: never null
    "apo_phi": (_number, "a finite number"),
    "apo_anchor": (_number, "a finite number"),
    "policy_lag": (_lag, "a whole number of weight versions from 0 to 2^53 (null on verl's padding rows only)"),
}


@dataclass
class Step:
    """One training step's responses, in the dump's order."""

    step: int
    outputs: list[str]
    scores: np.ndarray
    groups: np.ndarray  # prompt group label per response
    data_sources: Optional[np.ndarray]
    lengths: Optional[np.ndarray] = None  # filled by load_run
    # Each response's length as its estimator read it (its response mask's sum): the dump's, of the final output
    # for a multi-output trajectory (``lengths`` counts all its outputs); completed by load_run without them.
    estimator_lengths: Optional[np.ndarray] = None
    truncated: Optional[np.ndarray] = None
    logged_lengths: Optional[np.ndarray] = None
    logged_truncated: Optional[np.ndarray] = None
    logged_advantages: Optional[np.ndarray] = None
    logged_phi: Optional[np.ndarray] = None
    logged_anchor: Optional[np.ndarray] = None
    policy_lag: Optional[np.ndarray] = None  # verl's staleness (weight versions) of each response, if dumped
    path: Optional[Path] = None  # the step's file, and each response's line in it: for errors that name a row
    lines: Optional[np.ndarray] = None

    def where(self, row: int) -> str:
        """``file:line`` of response ``row``."""
        return f"{self.path}:{self.lines[row]}" if self.lines is not None else f"step {self.step}, row {row}"


@dataclass
class Run:
    name: str
    folder: Path
    steps: list[Step]
    length_source: str  # a key of LENGTH_UNITS

    @property
    def length_unit(self) -> str:
        return LENGTH_UNITS[self.length_source]


def rollout_folder(path: Path) -> Path:
    """The folder of step files: ``path`` itself, or ``path/rollouts`` (a recipe run's checkpoint folder)."""
    path = Path(path)
    if not path.is_dir():
        raise AuditError(f"{path}: not a folder (give the run's trainer.rollout_data_dir or its checkpoint folder)")
    if not _step_files(path) and (path / "rollouts").is_dir():
        return path / "rollouts"
    return path


def _step_files(folder: Path) -> list[tuple[int, Path]]:
    """``(step, file)`` of every ``<step>.jsonl``, by step; two files of one step (``1.jsonl``, ``01.jsonl``)
    are refused, naming both."""
    try:
        names = sorted(entry.name for entry in folder.iterdir())
    except OSError as exc:
        raise AuditError(f"{folder}: cannot be read ({exc.strerror or exc})") from None
    files: dict[int, Path] = {}
    for name in names:
        digits = re.fullmatch(r"([0-9]+)\.jsonl", name)  # ASCII digits: str.isdigit() takes "²" too
        if digits is None:
            continue
        step = _digits(digits.group(1), MAX_STEP)
        if step is None:
            raise AuditError(f"{folder}/{cut_short(name)}: step {cut_short(digits.group(1))} is beyond 2^53, more "
                             "steps than any run has (the step bounds its rows' policy lags and is the report's "
                             "step axis)")
        if step in files:
            raise AuditError(f"{folder}: {files[step].name} and {name} are both step {step}; keep one of them")
        files[step] = folder / name
    return sorted(files.items())


def _digits(text: str, high: int) -> Optional[int]:
    """ASCII digits ``text`` as an int if it is at most ``high``, else None. Bounded as written, before int(),
    which refuses 4301 digits and more (leading zeros included)."""
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(high)) or int(significant) > high:
        return None
    return int(significant)


def run_name(folder: Path) -> str:
    """``<experiment>`` for ``.../<experiment>/rollouts``, else the folder's name."""
    return folder.parent.name if folder.name == "rollouts" else folder.name


def cut_short(text: str, width: int = 40) -> str:
    """``text`` cut short to ``width`` characters: an error stays one readable line whatever it quotes."""
    return text if len(text) <= width else text[:width - 3] + "..."


def _shown(value: Any) -> str:
    """A field's value as the file spells it (``null``, ``"abc"``), cut short: an error stays one line."""
    return cut_short(json.dumps(value, ensure_ascii=False))


def _check_lag(path: Path, number: int, value: Any, lag: Optional[int], step: int) -> None:
    """A policy lag no response of step ``step`` can have is refused naming its line. verl's lag is the step's
    policy (weight version ``step - 1``: the policy trained at step t is version t - 1) minus the version that
    generated the response, and versions are the trainer's step counts, from 0: so 0 <= lag <= step - 1."""
    if lag is not None and lag > step - 1:
        raise AuditError(f"{path}:{number}: policy_lag {_shown(value)} is more than step {step} allows (at most "
                         f"{step - 1}: step {step} trains weight version {step - 1}, and versions start at 0)")


def read_step(path: Path, step: int) -> Step:
    """One step file's rows, each field checked against ``FIELDS``; the first row that breaks a rule is refused
    naming ``path:line`` and the field."""
    columns: dict[str, list] = {}
    lines: list[int] = []
    uid_lines: dict[str, int] = {}
    for number, row in read_rows(path, ("output", "score"), "not a verl rollout dump?", AuditError):
        present = [field for field in FIELDS if field in row]
        if not lines:
            columns = {field: [] for field in present}
        elif present != list(columns):
            # A step's rows are written together with the same fields; one without them was not.
            field = next(f for f in FIELDS if (f in row) != (f in columns))
            has = "has" if field in columns else "has not"
            raise AuditError(f"{path}:{number}: {'a' if field in row else 'no'} {field} field, which line "
                             f"{lines[0]} {has} (the rows of a step carry the same fields)")
        for field in present:
            rule, wanted = FIELDS[field]
            value = rule(row[field])
            if value is _BAD:
                raise AuditError(f"{path}:{number}: {field} {_shown(row[field])} is not {wanted}")
            columns[field].append(value)
        if "step" in row and columns["step"][-1] != step:
            raise AuditError(f"{path}:{number}: step {_shown(row['step'])} is not the file's step {step}")
        if "policy_lag" in row:
            _check_lag(path, number, row["policy_lag"], columns["policy_lag"][-1], step)
        if "uid" in row:
            first = uid_lines.setdefault(row["uid"], number)
            if first != number:
                raise AuditError(f"{path}:{number}: uid {_shown(row['uid'])} again (first on line {first}): "
                                 "a row written twice?")
        lines.append(number)
    if not lines:
        raise AuditError(f"{path}: no responses (an empty step file: a writer that stopped before its first row?)")
    final_lengths = columns.get("response_length")
    if "uid" in columns:
        columns, lines, final_lengths = _one_row_per_trajectory(columns, lines, path)
        if not lines:
            raise AuditError(f"{path}: only verl's padding rows, no responses")
        groups = [_UID.fullmatch(uid).group(1) for uid in columns["uid"]]
    elif "input" in columns:  # verl's legacy trainer dumps no uid: a step's responses to one prompt are a group
        groups = [f"{step}:{text}" for text in columns["input"]]
    else:
        raise AuditError(f"{path}:{lines[0]}: neither a uid nor an input field: the prompt groups are unknown")

    def column(field: str, dtype: Any = np.float64) -> Optional[np.ndarray]:
        return np.asarray(columns[field], dtype=dtype) if field in columns else None

    return Step(
        step=step,
        outputs=columns["output"],
        scores=column("score"),
        groups=np.asarray(groups, dtype=object),
        data_sources=column("data_source", object),
        logged_lengths=column("response_length"),
        estimator_lengths=None if final_lengths is None else np.asarray(final_lengths, dtype=np.float64),
        logged_truncated=column("truncated", bool),
        logged_advantages=column("advantage"),
        logged_phi=column("apo_phi"),
        logged_anchor=column("apo_anchor"),
        policy_lag=_lags(columns, lines, path),
        path=Path(path),
        lines=np.asarray(lines),
    )


def _lags(columns: dict[str, list], lines: list[int], path: Path) -> Optional[np.ndarray]:
    if "policy_lag" not in columns:
        return None
    missing = [line for line, lag in zip(lines, columns["policy_lag"]) if lag is None]
    if missing:
        raise AuditError(f"{path}:{missing[0]}: policy_lag null on a response that is not verl's padding row")
    return np.asarray(columns["policy_lag"], dtype=np.int64)


def _one_row_per_trajectory(columns: dict[str, list], lines: list[int],
                            path: Path) -> tuple[dict[str, list], list[int], Optional[list]]:
    """A step's responses as the recipe's trainer counts them: verl's padding rows (uid ``pad...``) left out, and
    a multi-output trajectory (rows ``{sample}_{rollout}_0``, ``_1``, ...) as one response, its final output (the
    one verl scores; its advantage and Phi are every output's), with the token lengths of all its outputs (every
    one of them is trained). Single-output steps come back unchanged. An output index no row count justifies is
    refused naming its line. Third: the final outputs' own lengths (the rows the estimator read), if dumped."""
    final: dict[str, tuple[int, int]] = {}  # trajectory -> (its largest output index, that output's row)
    total: dict[str, float] = {}
    lengths = columns.get("response_length")
    for row, uid in enumerate(columns["uid"]):
        if uid.startswith("pad"):
            continue
        trajectory, digits = uid.rsplit("_", 1)
        # verl numbers a trajectory's outputs 0, 1, ... and dumps every one into the step's file: an index is
        # below the file's row count. ({rollout}, the uid's other number, is never read as a number: it is part
        # of the trajectory's key, as text.)
        index = _digits(digits, len(lines) - 1)
        if index is None:
            raise AuditError(f"{path}:{lines[row]}: uid {_shown(uid)} has output index {cut_short(digits)}, beyond "
                             f"the step's {len(lines)} rows (verl numbers a trajectory's outputs 0, 1, ... and "
                             "dumps each one)")
        if trajectory not in final or index > final[trajectory][0]:
            final[trajectory] = (index, row)
        if lengths is not None:
            total[trajectory] = total.get(trajectory, 0) + lengths[row]
    keep = sorted(row for _, row in final.values())
    if len(keep) == len(lines):
        return columns, lines, lengths
    kept = {field: [values[row] for row in keep] for field, values in columns.items()}
    if lengths is not None:
        kept["response_length"] = [total[uid.rsplit("_", 1)[0]] for uid in kept["uid"]]
    return kept, [lines[row] for row in keep], None if lengths is None else [lengths[row] for row in keep]


def check_data_sources(run: Run, why: str) -> None:
    """Refuse a run whose rows cannot be replayed per data source: the first row without a ``data_source``
    (and how many lack one), or the first of a prompt group whose ``data_source`` differs from the group's."""
    lacking = [step for step in run.steps if step.data_sources is None]
    if lacking:
        rows = sum(len(step.scores) for step in lacking)
        raise AuditError(f"{lacking[0].where(0)}: no data_source field, which {why} needs ({rows} "
                         f"row{'s' * (rows != 1)} in {len(lacking)} of the run's {len(run.steps)} step files lack it)")
    for step in run.steps:
        seen: dict[Any, int] = {}
        for row, (group, source) in enumerate(zip(step.groups, step.data_sources)):
            first = seen.setdefault(group, row)
            if step.data_sources[first] != source:
                raise AuditError(f"{step.where(row)}: data_source {_shown(source)} in a prompt group whose line "
                                 f"{step.lines[first]} has {_shown(step.data_sources[first])}; {why} needs one "
                                 "data_source per group")


def load_run(path: Path, tokenizer: Any = None, max_response_length: Optional[int] = None,
             name: Optional[str] = None) -> Run:
    """Every step of one run's dump, with lengths (see the module docstring) and truncation where known.

    ``tokenizer``: a Hugging Face tokenizer, used when the dump has no token lengths. ``max_response_length``:
    the run's cap, to tell truncation from token lengths when the dump does not say.
    """
    folder = rollout_folder(path)
    files = _step_files(folder)
    if not files:
        raise AuditError(f"{folder}: no <step>.jsonl files (verl writes them with trainer.rollout_data_dir=...)")
    steps = [read_step(file, step) for step, file in files]
    if all(s.logged_lengths is not None for s in steps):
        source = "dump"
    elif tokenizer is not None:
        source = "tokenizer"
    else:
        source = "characters"
    for s in steps:
        if source == "dump":
            s.lengths = s.logged_lengths
        elif source == "tokenizer":
            ids = tokenizer(s.outputs, add_special_tokens=False)["input_ids"]
            s.lengths = np.asarray([len(i) for i in ids], dtype=np.float64)
        else:
            s.lengths = np.asarray([len(text) for text in s.outputs], dtype=np.float64)
        if source != "dump":
            s.estimator_lengths = np.maximum(s.lengths, 1.0)
        if s.logged_truncated is not None:
            s.truncated = s.logged_truncated
        elif source != "characters" and max_response_length is not None:
            s.truncated = s.lengths >= max_response_length
    return Run(name=name or run_name(folder), folder=folder, steps=steps, length_source=source)
