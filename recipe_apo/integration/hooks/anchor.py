"""APO's capability anchor C_t in the trainer: one fresh anchor per run (or the checkpoint's on resume),
``global_step_N/apo_state.json`` in every checkpoint, the per-response ``data_source`` handed to the estimator
with ``algorithm.apo.anchor_scope=data_source``, the ``apo/...`` metrics, and Phi_i and C_t in the dump."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from recipe_apo.integration import batch_fields
from recipe_apo.integration.checkpoint import restore_for_run, save_anchor_state, uses_apo
from recipe_apo.integration.hooks.base import TrainerHook
from recipe_apo.methods.anchor import batch_scopes, driver_anchors, reset_driver_anchor
from recipe_apo.methods.apo_settings import ApoSettings


class AnchorHook(TrainerHook):
    @classmethod
    def wanted(cls, config: Any) -> bool:
        return uses_apo(config)

    def __init__(self, trainer: Any, config: Any) -> None:
        super().__init__(trainer, config)
        self.settings = ApoSettings.from_algorithm_config(self.config.algorithm)
        reset_driver_anchor()

    def restored(self, folder: Optional[str], step: int) -> None:
        restore_for_run(self.config, folder)

    def save(self, folder: str, step: int) -> None:
        save_anchor_state(folder, step)

    def around_advantage(self, batch: Any):
        book = driver_anchors()
        # A step that computes no APO advantages logs and dumps no stale anchor.
        book.last_metrics, book.last_phi, book.last_anchor = {}, None, None
        by_source = self.settings.anchor_scope == "data_source"
        return batch_scopes(batch_fields.data_sources(batch) if by_source else None)

    def after_advantage(self, batch: Any, metrics: dict) -> None:
        metrics.update(driver_anchors().last_metrics)

    def dump_fields(self, batch: Any) -> dict[str, list]:
        book = driver_anchors()
        if book.last_phi is None or len(book.last_phi) != len(batch.keys):
            return {}
        return {"apo_phi": np.asarray(book.last_phi, dtype=float).tolist(),
                "apo_anchor": np.asarray(book.last_anchor, dtype=float).tolist()}
