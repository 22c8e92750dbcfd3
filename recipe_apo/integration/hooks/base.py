"""What a feature of the recipe's trainer can do at verl's hand-off points.

The recipe's trainer (``recipe_apo.integration.trainer``) keeps a list of hooks and calls each active one, in
list order, where verl's V1 trainer hands over: at the start of a run, when a checkpoint is restored or saved,
when the next batch of prompts is drawn, around and after the advantage step, and when the rollout dump is
written. Every call is optional: the base class does nothing, a hook overrides the few it needs.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional


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

    def replace_batch(self, num_prompts: int) -> Optional[Any]:
        """This step's prompts instead of the dataloader's, or None to let verl draw them."""
        return None

    def drew_batch(self, batch: Any) -> None:
        """The prompts verl drew from its dataloader for this step, before they go to the rollout."""

    def around_advantage(self, batch: Any) -> ContextManager:
        """A context held while verl computes this step's advantages (e.g. to hand the estimator more data)."""
        return contextlib.nullcontext()

    def after_advantage(self, batch: Any, metrics: dict) -> None:
        """After verl wrote the advantages: change them, or add to this step's ``metrics``."""

    def dump_fields(self, batch: Any) -> dict[str, list]:
        """Extra per-response columns for verl's rollout dump, in ``batch.keys`` order."""
        return {}
