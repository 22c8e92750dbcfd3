"""What a feature of the recipe's trainer can do at verl's hand-off points.

The recipe's trainer (``recipe_apo.integration.trainer``) keeps a list of hooks and calls each active one, in
list order, where verl's V1 trainer hands over: at the start of a run, when a checkpoint is restored or saved,
when the next batch of prompts is drawn, around and after the advantage step, and when the rollout dump is
written. Every call is optional: the base class does nothing, a hook overrides the few it needs.

The advantage step's calls get the step's trajectories (``recipe_apo.integration.multi_output.Sessions``): with
a multi-output agent loop the ``apo`` and ``codapo`` estimators see each trajectory's final output only, so a
hook hands them the final rows' data (``sessions.finals``) and gives every row its trajectory's value
(``sessions.broadcast``). ``RowColumns`` keeps a hook's per-row dump columns by row key until the dump.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional, Sequence

import numpy as np
import pandas as pd

from recipe_apo.errors import RecipeError
from recipe_apo.integration.multi_output import Sessions


class TrainerHook:
    """One feature of the recipe's trainer; ``trainer`` is verl's trainer object (its global step, tokenizer...)."""

    @classmethod
    def wanted(cls, config: Any) -> bool:
        """Whether a run of this config uses the feature (its hook is then built at the start of the run)."""
        return True

    def __init__(self, trainer: Any, config: Any) -> None:
        self.trainer, self.config = trainer, config

    def restored(self, folder: Optional[str], step: int) -> None:
        """After verl restored its checkpoint: ``folder`` holds step ``step`` (None and 0: a fresh start)."""

    def save(self, folder: str, step: int) -> None:
        """Before verl saves step ``step`` into ``folder`` (verl marks the folder latest only afterwards)."""

    def begin_step(self) -> None:
        """A training step starts (verl may then run several advantage steps, one per mini-batch)."""

    def end_step(self, metrics: dict) -> None:
        """The training step's updates are done; ``metrics`` holds verl's aggregate over its mini-batches."""

    def replace_batch(self, num_prompts: int) -> Optional[Any]:
        """This step's prompts instead of the dataloader's, or None to let verl draw them."""
        return None

    def drew_batch(self, batch: Any) -> None:
        """The prompts verl drew from its dataloader for this step, before they go to the rollout."""

    def around_advantage(self, batch: Any, sessions: Sessions) -> ContextManager:
        """A context held while verl computes this step's advantages (e.g. to hand the estimator more data)."""
        return contextlib.nullcontext()

    def after_advantage(self, batch: Any, metrics: dict, sessions: Sessions) -> None:
        """After verl wrote the advantages: change them, or add to this step's ``metrics``."""

    def after_update(self, batch: Any, metrics: dict) -> None:
        """After verl's actor update of this batch (all its epochs and mini-batches), before the step ends."""

    def dump_fields(self, batch: Any) -> dict[str, list]:
        """Extra per-response columns for verl's rollout dump, in ``batch.keys`` order; a column the hook cannot
        give every row raises (``DumpFieldsError``), it is never left out silently."""
        return {}


class DumpFieldsError(RecipeError, ValueError):
    """A hook's dump columns do not cover the dumped rows; the message names the column and the rows."""


class RowColumns:
    """A hook's per-row dump columns from the advantage step(s) of one training step, by row key.

    verl's sync trainer runs ``trainer.v1.sync.parameter_sync_step`` advantage steps per training step and dumps
    their rows together (``trainer_base.py:549-559``): each step's columns are kept under its own keys and the
    dump takes them in its own row order. Values are one per trajectory, broadcast to its rows at the dump.
    """

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.parts: list[tuple[Sessions, dict[str, Any]]] = []

    def clear(self) -> None:
        self.step, self.parts = None, []

    def add(self, step: int, sessions: Sessions, per_trajectory: dict[str, Any]) -> None:
        """One advantage step's values, one per trajectory of ``sessions`` (a new training step starts afresh)."""
        if step != self.step:
            self.step, self.parts = step, []
        self.parts.append((sessions, per_trajectory))

    def for_rows(self, keys: Sequence[str]) -> dict[str, list]:
        """Every column, one float per key of ``keys``; ``DumpFieldsError`` when a key has no value."""
        if not self.parts:
            return {}
        frames = [pd.DataFrame({name: np.asarray(sessions.broadcast(values), dtype=float)
                                for name, values in columns.items()}, index=pd.Index(list(sessions.keys)))
                  for sessions, columns in self.parts]
        sessions = self.parts[0][0]
        if len(frames) == 1 and (keys is sessions.keys or list(keys) == list(sessions.keys)):
            return {name: column.tolist() for name, column in frames[0].items()}
        frame = pd.concat(frames)
        frame = frame[~frame.index.duplicated(keep="last")]
        missing = ~pd.Index(list(keys)).isin(frame.index)
        if missing.any():
            rows = np.flatnonzero(missing)
            raise DumpFieldsError(
                f"{', '.join(frame.columns)}: {rows.size} of {len(keys)} dumped rows were not in this step's "
                f"advantage step (first key {keys[rows[0]]!r})"
            )
        return {name: column.tolist() for name, column in frame.loc[list(keys)].items()}
