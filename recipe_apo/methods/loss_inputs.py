"""Per-row inputs of a policy loss beyond what verl passes one (a method's ``loss_columns``), handed to the loss
micro-batch by micro-batch.

verl's ``ppo_loss`` calls a registered policy loss with the log-probs, advantages, mask and actor config only, by
keyword (``policy_loss_fn(old_log_prob=..., log_prob=..., advantages=..., response_mask=..., loss_agg_mode=...,
config=..., rollout_is_weights=...)``): no argument of it can carry a batch column, so the columns pass beside the
call, in this thread, for the call's duration. A method whose loss reads more per row (AGPO (dual)'s per-prompt
clip) declares the columns; its runtime computes them per row of the step, and each adapter hands the micro-batch's
rows while the loss runs: verl's trainer through its actor workers' loss function
(``recipe_apo.integration.verl_worker_access.ColumnLoss``), the testbed in its own update.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Mapping, Optional

import torch

__all__ = ["handed_column", "handed_columns"]

_HANDED = threading.local()


@contextlib.contextmanager
def handed_columns(columns: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Hand the losses computed while held ``columns``: name -> one value per row of their micro-batch."""
    previous = getattr(_HANDED, "columns", None)
    _HANDED.columns = {**(previous or {}), **columns}
    try:
        yield
    finally:
        _HANDED.columns = previous


def handed_column(name: str) -> Optional[torch.Tensor]:
    """The column ``name`` handed to the current loss call, or None."""
    columns = getattr(_HANDED, "columns", None)
    return None if columns is None else columns.get(name)
