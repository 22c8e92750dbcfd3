"""APO's capability anchor C_t in the trainer: one fresh anchor per run (or the checkpoint's on resume),
``global_step_N/apo_state.json`` in every checkpoint, the per-response ``data_source`` handed to the estimator
with ``algorithm.apo.anchor_scope=data_source``, the ``apo/...`` metrics, and Phi_i and C_t in the dump.

With a multi-output agent loop the estimator's responses are the trajectories, each its final output
(``recipe_apo.integration.multi_output``): the data sources handed over are the final rows', and every output
row of a trajectory gets the trajectory's Phi_i and C_t in the dump."""

from __future__ import annotations

from typing import Any, Optional

from recipe_apo.integration import batch_fields
from recipe_apo.integration.checkpoint import restore_for_run, save_anchor_state, uses_apo
from recipe_apo.integration.hooks.base import RowColumns, TrainerHook
from recipe_apo.integration.multi_output import Sessions
from recipe_apo.methods import driver_state
from recipe_apo.methods.apo_settings import ApoSettings


class AnchorHook(TrainerHook):
    @classmethod
    def wanted(cls, config: Any) -> bool:
        return uses_apo(config)

    def __init__(self, trainer: Any, config: Any) -> None:
        super().__init__(trainer, config)
        self.settings = ApoSettings.from_algorithm_config(self.config.algorithm)
        self.columns = RowColumns()
        driver_state.reset_driver_anchors()

    def restored(self, folder: Optional[str], step: int) -> None:
        restore_for_run(self.config, folder)

    def save(self, folder: str, step: int) -> None:
        save_anchor_state(folder, step)

    def book(self):
        """The driver's anchors (created with this run's settings when the run has none yet)."""
        return driver_state.driver_anchors(init=self.settings.anchor_init, history=self.settings.history)

    def begin_step(self) -> None:
        self.book().begin_step()

    def end_step(self, metrics: dict) -> None:
        # verl averages a step's mini-batch metrics; the anchor moved once, with the step's pooled y_t.
        by_source = self.settings.anchor_scope == "data_source"
        for scope, (value, rate, y) in self.book().step_results.items():
            suffix = f"/{scope}" if by_source else ""
            metrics.update({f"apo/anchor{suffix}": value, f"apo/anchor_rate{suffix}": rate})
            metrics[f"apo/batch_success{suffix}"] = y

    def around_advantage(self, batch: Any, sessions: Sessions):
        # A step that computes no APO advantages logs and dumps no stale anchor.
        driver_state.clear_results("apo")
        if self.trainer.global_steps != self.columns.step:
            self.columns.clear()
        by_source = self.settings.anchor_scope == "data_source"
        return driver_state.handed(scopes=sessions.finals(batch_fields.data_sources(batch)) if by_source else None)

    def after_advantage(self, batch: Any, metrics: dict, sessions: Sessions) -> None:
        result = driver_state.last_result("apo")
        if result is not None:  # None: the estimator saw no response with a token
            metrics.update(result.metrics)
            self.columns.add(self.trainer.global_steps, sessions,
                             {"apo_phi": result.per_response["phi"], "apo_anchor": result.per_response["anchor"]})

    def dump_fields(self, batch: Any) -> dict[str, list]:
        return self.columns.for_rows(batch.keys)
