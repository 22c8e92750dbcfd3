"""The rollouts verl dumps with ``trainer.rollout_data_dir=DIR``: one ``DIR/<step>.jsonl`` per training step.

Each line holds verl's fields ``input``, ``output`` (both decoded without special tokens), ``gts``, ``score``
and ``step``; verl's V1 trainer adds ``uid`` = ``{sample}_{rollout}_{output}``, whose ``{sample}`` is the prompt
group. The recipe's trainer adds, without touching verl's fields: ``response_length`` (tokens),
``advantage`` (what the loss used), ``data_source``, ``truncated`` (reached the cap without an end token) and,
for APO, ``apo_phi`` (Phi_i as computed; ``lambda_scale`` where the centered reward is 0, which the advantage
ignores) and ``apo_anchor`` (C_t of the response's scope). A dump without ``uid`` (verl's legacy trainer) is
grouped by prompt text within each step.

Lengths: the dump's ``response_length`` if every row has one; else the output re-tokenized with the model's
tokenizer (``tokenizer``); else characters, and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from recipe_apo.errors import RecipeError
from recipe_apo.integration.jsonl import read_rows


class AuditError(RecipeError, ValueError):
    """A dump the audit cannot read; the message is one line naming the file (and line) at fault."""


LENGTH_UNITS = {"dump": "tokens", "tokenizer": "tokens (re-tokenized)", "characters": "characters"}


@dataclass
class Step:
    """One training step's responses, in the dump's order."""

    step: int
    outputs: list[str]
    scores: np.ndarray
    groups: np.ndarray  # prompt group label per response
    data_sources: Optional[np.ndarray]
    lengths: Optional[np.ndarray] = None  # filled by load_run
    truncated: Optional[np.ndarray] = None
    logged_lengths: Optional[np.ndarray] = None
    logged_truncated: Optional[np.ndarray] = None
    logged_advantages: Optional[np.ndarray] = None
    logged_phi: Optional[np.ndarray] = None
    logged_anchor: Optional[np.ndarray] = None


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
    return sorted((int(p.stem), p) for p in folder.glob("*.jsonl") if p.stem.isdigit())


def run_name(folder: Path) -> str:
    """``<experiment>`` for ``.../<experiment>/rollouts``, else the folder's name."""
    return folder.parent.name if folder.name == "rollouts" else folder.name


def _column(rows: list[dict], key: str, dtype=np.float64) -> Optional[np.ndarray]:
    """A field present in every row as an array, else None; JSON nulls become NaN."""
    if not rows or any(key not in row for row in rows):
        return None
    values = [row[key] for row in rows]
    if dtype is object:
        return np.asarray(values, dtype=object)
    return np.asarray([np.nan if v is None else v for v in values], dtype=dtype)


def _group_label(row: dict, step: int) -> str:
    uid = row.get("uid")
    if isinstance(uid, str) and uid.count("_") >= 2:
        return uid.rsplit("_", 2)[0]
    return f"{step}:{row.get('input', '')}"


def read_step(path: Path, step: int) -> Step:
    rows = []
    for number, row in read_rows(path, ("output", "score"), "not a verl rollout dump?", AuditError):
        if not isinstance(row["score"], (int, float)) or isinstance(row["score"], bool) \
                or not np.isfinite(row["score"]):
            raise AuditError(f"{path}:{number}: score {row['score']!r} is not a finite number")
        rows.append(row)
    if not rows:
        raise AuditError(f"{path}: no responses")
    return Step(
        step=step,
        outputs=[str(row["output"]) for row in rows],
        scores=np.asarray([float(row["score"]) for row in rows]),
        groups=np.asarray([_group_label(row, step) for row in rows], dtype=object),
        data_sources=_column(rows, "data_source", dtype=object),
        logged_lengths=_column(rows, "response_length"),
        logged_truncated=_column(rows, "truncated"),
        logged_advantages=_column(rows, "advantage"),
        logged_phi=_column(rows, "apo_phi"),
        logged_anchor=_column(rows, "apo_anchor"),
    )


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
        if s.logged_truncated is not None:
            s.truncated = s.logged_truncated.astype(bool)
        elif source != "characters" and max_response_length is not None:
            s.truncated = s.lengths >= max_response_length
    return Run(name=name or run_name(folder), folder=folder, steps=steps, length_source=source)
