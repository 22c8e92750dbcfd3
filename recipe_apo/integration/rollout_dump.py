"""What the recipe's trainer adds to verl's rollout dump (``trainer.rollout_data_dir``).

- For every method, what the bias audit (``python -m recipe_apo.audit``) needs and verl's dump lacks: each
  response's ``response_length`` (tokens), ``advantage`` (the one the loss used), ``truncated`` and ``data_source``
  (``recipe_apo.audit.dumps`` reads them); and how stale each response is, in verl's own units (weight versions,
  from the ``min_global_steps``/``max_global_steps`` verl tags each trajectory with): ``policy_lag`` = verl's
  ``trajectory_staleness`` (the step's policy minus the freshest weights that generated the response; 0
  on-policy) and ``policy_lag_worst`` (minus the oldest: a partial rollout resumed across updates spans several).
- The active methods' own columns (``StepOutput.dump``: APO's ``apo_phi``, ``apo_anchor``...), kept by row key
  from the step's advantage steps until the dump (``RowColumns``).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from recipe_apo.errors import RecipeError
from recipe_apo.integration import verl_access
from recipe_apo.methods.errors import BatchInputError
from recipe_apo.reward.truncation import end_token_ids, generation_config_of, truncated_rows


class DumpFieldsError(RecipeError, ValueError):
    """The methods' dump columns do not cover the dumped rows; the message names the columns and the rows."""


class RowColumns:
    """The methods' per-row dump columns from the advantage step(s) of one training step, by row key.

    verl's sync trainer runs ``trainer.v1.sync.parameter_sync_step`` advantage steps per training step and dumps
    their rows together (``trainer_base.py:549-559``): each step's columns are kept under its own keys and the
    dump takes them in its own row order.
    """

    def __init__(self) -> None:
        self.step: Optional[int] = None
        self.parts: list[pd.DataFrame] = []

    def add(self, step: int, keys: Sequence[str], columns: Mapping[str, Any]) -> None:
        """One advantage step's columns, one value per row of ``keys`` (a new training step starts afresh)."""
        if step != self.step:
            self.step, self.parts = step, []
        if columns:
            self.parts.append(pd.DataFrame({name: np.asarray(values, dtype=float) for name, values in columns.items()},
                                           index=pd.Index(list(keys))))

    def for_rows(self, keys: Sequence[str]) -> dict[str, list]:
        """Every column, one float per key of ``keys``; ``DumpFieldsError`` when a key has no value."""
        if not self.parts:
            return {}
        frame = pd.concat(self.parts) if len(self.parts) > 1 else self.parts[0]
        if len(self.parts) == 1 and list(keys) == list(frame.index):
            return {name: column.tolist() for name, column in frame.items()}
        frame = frame[~frame.index.duplicated(keep="last")]
        missing = ~pd.Index(list(keys)).isin(frame.index)
        if missing.any():
            rows = np.flatnonzero(missing)
            raise DumpFieldsError(
                f"{', '.join(frame.columns)}: {rows.size} of {len(keys)} dumped rows were not in this step's "
                f"advantage step (first key {keys[rows[0]]!r})"
            )
        return {name: column.tolist() for name, column in frame.loc[list(keys)].items()}


class AuditFields:
    """The audit's columns of a dumped step (the module's docstring)."""

    def __init__(self, trainer: Any, config: Any) -> None:
        self.trainer, self.config = trainer, config

    @functools.cached_property
    def end_ids(self) -> frozenset[int]:
        return end_token_ids(self.trainer.tokenizer,
                             generation_config_of(self.config.actor_rollout_ref.model.get("path")))

    def __call__(self, batch: Any) -> dict[str, list]:
        data = verl_access.read(batch, ["responses", "response_mask", "advantages"])
        responses = data["responses"].to_padded_tensor(padding=0)
        lengths = data["response_mask"].to_padded_tensor(padding=0).sum(dim=-1)
        # Outcome advantages are one value on every token of a response: its first token's.
        advantages = data["advantages"].to_padded_tensor(padding=0.0)[:, 0]
        cap = int(self.config.actor_rollout_ref.rollout.response_length)
        fields = {
            "response_length": lengths.tolist(),
            "advantage": advantages.float().tolist(),
            "truncated": truncated_rows(responses, lengths, cap, self.end_ids).float().tolist(),
        }
        try:
            fields["data_source"] = verl_access.data_sources(batch).tolist()
        except BatchInputError:
            pass  # a dataset without data_source: the dump goes without it
        fields.update(policy_lags(batch.tags, verl_access.global_steps(self.trainer)))
        return fields


def policy_lags(tags: list[dict], global_steps: int) -> dict[str, list]:
    """verl's staleness of each row (its ``_compute_metrics``: the policy trained at step t is version t - 1);
    null for a row verl recorded no versions for (its padding rows), nothing when no row has them."""
    versioned = [t.get("min_global_steps") is not None and t.get("max_global_steps") is not None for t in tags]
    if not any(versioned):
        return {}
    current = global_steps - 1
    return {"policy_lag": [current - int(t["max_global_steps"]) if v else None for t, v in zip(tags, versioned)],
            "policy_lag_worst": [current - int(t["min_global_steps"]) if v else None
                                 for t, v in zip(tags, versioned)]}
