"""The recipe's trainer: verl's synchronous V1 trainer, plus the APO anchor's checkpoints and metrics.

Registered with verl as ``trainer.v1.trainer_mode=apo_sync``. verl picks the trainer class by that name, and
any name other than ``sync`` turns on asynchronous code paths in verl's base trainer; so this class sets the
mode back to ``sync`` before verl reads it, and every step runs exactly as verl's own sync trainer runs it.

What it adds, only when ``algorithm.adv_estimator=apo``:
- a fresh anchor at the start of each run (also for each job of a multirun), or the anchor of the checkpoint
  the run resumes from (``recipe_apo.checkpoint``);
- ``global_step_N/apo_state.json`` in every checkpoint folder;
- the anchor's ``apo/...`` metrics in every step's metrics, so they reach whatever ``trainer.logger`` names;
- the per-response ``data_source`` handed to the estimator when ``algorithm.apo.anchor_scope=data_source``.

For every method, when ``trainer.rollout_data_dir`` is set, each rollout dump row also carries what the bias
audit (``python -m recipe_apo.audit``) needs and verl's dump lacks, beside verl's fields, unchanged:
``response_length`` (tokens), ``advantage`` (the one the loss used), ``truncated``, ``data_source`` and, for
APO, ``apo_phi`` and ``apo_anchor`` (``recipe_apo.audit.dumps``).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from recipe_apo.anchor import batch_scopes, driver_anchors, reset_driver_anchor
from recipe_apo.reward_manager import end_token_ids, generation_config_of, truncated_rows
from recipe_apo.checkpoint import restore_for_run, save_anchor_state, uses_apo
from recipe_apo.estimator import ApoInputError
from recipe_apo.settings import ApoSettings

TRAINER_NAME = "apo_sync"


@register_trainer(TRAINER_NAME)
class ApoSyncTrainer(PPOTrainerSync):
    def __init__(self, config: DictConfig) -> None:
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self.apo_active = uses_apo(config)
        self.apo_settings = ApoSettings.from_algorithm_config(config.algorithm)
        reset_driver_anchor()

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.apo_active:
            restore_for_run(self.config, self._resumed_folder())
        return result

    def _resumed_folder(self):
        """The folder verl just resumed from, read off the step it restored (0: a fresh start)."""
        if self.global_steps == 0:
            return None
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            return os.path.abspath(str(trainer.resume_from_path))
        return os.path.join(os.path.abspath(str(trainer.default_local_dir)), f"global_step_{self.global_steps}")

    def _save_checkpoint(self):
        if self.apo_active:
            # Before verl's own save, which ends by pointing latest_checkpointed_iteration.txt at this folder:
            # a folder that resume can find always has its anchor state.
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            save_anchor_state(folder, self.global_steps)
        return super()._save_checkpoint()

    def _compute_advantage(self, batch, metrics: dict):
        scopes = None
        if self.apo_active and self.apo_settings.anchor_scope == "data_source":
            scopes = self._data_sources(batch)
        book = driver_anchors()
        # A step that computes no APO advantages logs and dumps no stale anchor.
        book.last_metrics, book.last_phi, book.last_anchor = {}, None, None
        with batch_scopes(scopes):
            batch = super()._compute_advantage(batch, metrics)
        if self.apo_active:
            metrics.update(driver_anchors().last_metrics)
        return batch

    def _log_rollout_data(self, batch, timing_raw, rollout_data_dir):
        """verl's rollout dump, each row with the audit's fields added (module docstring)."""
        try:
            fields = self._audit_fields(batch)
        except Exception as exc:  # a diagnostic must not stop training: verl's own dump still goes out
            if not getattr(self, "_audit_fields_failed", False):
                print(f"recipe-apo: warning: rollout dump without the audit's fields ({type(exc).__name__}: {exc})",
                      flush=True)
                self._audit_fields_failed = True
            return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        position = {key: i for i, key in enumerate(batch.keys)}
        write = self._dump_generations

        def write_with_fields(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
            # verl sorts the rows by uid before writing; its "uid" list says in which order.
            order = [position[key] for key in reward_extra_infos_dict["uid"]]
            extra = {name: [values[i] for i in order] for name, values in fields.items()}
            return write(inputs, outputs, gts, scores, {**reward_extra_infos_dict, **extra}, dump_path)

        self._dump_generations = write_with_fields
        try:
            return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        finally:
            del self._dump_generations

    @functools.cached_property
    def _end_ids(self) -> frozenset[int]:
        return end_token_ids(self.tokenizer, generation_config_of(self.config.actor_rollout_ref.model.get("path")))

    def _audit_fields(self, batch) -> dict[str, list]:
        """Per response, in ``batch.keys`` order: length, advantage, truncation, data source, APO's Phi and C_t."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["responses", "response_mask", "advantages"])
        responses = data["responses"].to_padded_tensor(padding=0)
        lengths = data["response_mask"].to_padded_tensor(padding=0).sum(dim=-1)
        # Outcome advantages are one value on every token of a response: its first token's.
        advantages = data["advantages"].to_padded_tensor(padding=0.0)[:, 0]
        cap = int(self.config.actor_rollout_ref.rollout.response_length)
        fields = {
            "response_length": lengths.tolist(),
            "advantage": advantages.float().tolist(),
            "truncated": truncated_rows(responses, lengths, cap, self._end_ids).float().tolist(),
        }
        try:
            fields["data_source"] = self._data_sources(batch).tolist()
        except ApoInputError:
            pass  # a dataset without data_source: the dump goes without it
        book = driver_anchors()
        if self.apo_active and book.last_phi is not None and len(book.last_phi) == len(batch.keys):
            fields["apo_phi"] = np.asarray(book.last_phi, dtype=float).tolist()
            fields["apo_anchor"] = np.asarray(book.last_anchor, dtype=float).tolist()
        return fields

    @staticmethod
    def _data_sources(batch) -> np.ndarray:
        try:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["data_source"])
            sources = data["data_source"]
        except Exception as exc:  # the storage's own error types vary with its backend
            raise ApoInputError(
                f"algorithm.apo.anchor_scope=data_source: the batch has no data_source field ({exc}); "
                "add data_source to your dataset rows or use anchor_scope=global"
            ) from exc
        return np.asarray(sources.tolist() if hasattr(sources, "tolist") else list(sources), dtype=object)
