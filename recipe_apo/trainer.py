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

Only when ``algorithm.adv_estimator=codapo`` (``recipe_apo.methods.codapo``):
- the old policy's log-probs handed to the estimator, which verl does not pass them (``handed_log_probs``);
- with ``algorithm.codapo.resample=true``, every even step's prompts built from the previous step's kept prompts
  instead of the dataloader (``_next_train_batch``), and ``global_step_N/codapo_state.pt`` in the checkpoint of
  every odd step, restored on resume (``recipe_apo.resampling``).

With ``algorithm.zero_variance=exclude``, for any estimator: the advantages verl computed, rescaled so that
groups whose rewards are all equal leave the loss's denominator (``recipe_apo.methods.zero_variance``).

For every method, when ``trainer.rollout_data_dir`` is set, each rollout dump row also carries what the bias
audit (``python -m recipe_apo.audit``) needs and verl's dump lacks, beside verl's fields, unchanged:
``response_length`` (tokens), ``advantage`` (the one the loss used), ``truncated``, ``data_source`` and, for
APO, ``apo_phi`` and ``apo_anchor``, for CoDaPO ``codapo_weight`` (``recipe_apo.audit.dumps``).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from recipe_apo.methods.anchor import batch_scopes, driver_anchors, reset_driver_anchor
from recipe_apo.reward_manager import end_token_ids, generation_config_of, truncated_rows
from recipe_apo.checkpoint import restore_for_run, save_anchor_state, uses_apo
from recipe_apo.methods.codapo import CodapoSettings, codapo_book, handed_log_probs
from recipe_apo.methods.apo import ApoInputError
from recipe_apo.resampling import PromptResampler, first_of_pair
from recipe_apo.methods.apo_settings import ApoSettings
from recipe_apo.methods.zero_variance import exclude_zero_variance

TRAINER_NAME = "apo_sync"


@register_trainer(TRAINER_NAME)
class ApoSyncTrainer(PPOTrainerSync):
    def __init__(self, config: DictConfig) -> None:
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)
        self._init_recipe_state(config)

    def _init_recipe_state(self, config: DictConfig) -> None:
        """What the recipe adds to verl's trainer state, read from the config (a fresh anchor each run)."""
        self.apo_active = uses_apo(config)
        self.apo_settings = ApoSettings.from_algorithm_config(config.algorithm)
        self.codapo_active = str(config.algorithm.adv_estimator) == "codapo"
        settings = CodapoSettings.from_algorithm_config(config.algorithm)
        self.resampler = PromptResampler(settings) if self.codapo_active and settings.resample else None
        self.zero_variance = str(config.algorithm.get("zero_variance", "keep"))
        reset_driver_anchor()

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.apo_active:
            restore_for_run(self.config, self._resumed_folder())
        if self.resampler is not None and self.global_steps > 0:
            self.resampler.load(self._resumed_folder(), self.global_steps)
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
        # Before verl's own save, which ends by pointing latest_checkpointed_iteration.txt at this folder:
        # a folder that resume can find always has the recipe's state.
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if self.apo_active:
            save_anchor_state(folder, self.global_steps)
        if self.resampler is not None:
            self.resampler.save(folder, self.global_steps)
        return super()._save_checkpoint()

    def _next_train_batch(self, num_prompts=None):
        if self.resampler is None:
            return super()._next_train_batch(num_prompts)
        if first_of_pair(self.global_steps):
            batch = super()._next_train_batch(num_prompts)
            self.resampler.start_pair(batch, self.global_steps)
            return batch
        from verl.utils import tensordict_utils as tu

        batch = self.resampler.second_batch(num_prompts or int(self.config.data.train_batch_size), self.global_steps)
        tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)
        return batch

    def _compute_advantage(self, batch, metrics: dict):
        scopes = None
        if self.apo_active and self.apo_settings.anchor_scope == "data_source":
            scopes = self._data_sources(batch)
        book = driver_anchors()
        # A step that computes no APO advantages logs and dumps no stale anchor.
        book.last_metrics, book.last_phi, book.last_anchor = {}, None, None
        book_c = codapo_book()
        book_c.last_metrics, book_c.last_uids, book_c.last_weights = {}, None, None
        with batch_scopes(scopes), handed_log_probs(self._old_log_probs(batch) if self.codapo_active else None):
            batch = super()._compute_advantage(batch, metrics)
        if self.apo_active:
            metrics.update(driver_anchors().last_metrics)
        if self.codapo_active:
            metrics.update(book_c.last_metrics)
            if self.resampler is not None and first_of_pair(self.global_steps):
                self.resampler.add_weights(book_c.last_uids, book_c.last_weights)
        if self.zero_variance == "exclude":
            self._exclude_zero_variance(batch, metrics)
        return batch

    @staticmethod
    def _old_log_probs(batch):
        """The old policy's log-probs, padded as verl pads the rows it hands the estimator (same keys, order)."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["old_log_probs"])
        return data["old_log_probs"].to_padded_tensor(padding=0.0)

    def _exclude_zero_variance(self, batch, metrics: dict) -> None:
        """Rescale the advantages verl just wrote so the dead groups leave the loss's denominator."""
        from tensordict import TensorDict
        from verl.workers.utils.padding import response_to_nested

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "response_mask", "rm_scores", "advantages"])
        nested_mask = data["response_mask"]
        uids = np.asarray(list(data["uid"]), dtype=object)
        mask = nested_mask.to_padded_tensor(padding=0)
        scaled, zv_metrics = exclude_zero_variance(
            data["advantages"].to_padded_tensor(padding=0.0), data["rm_scores"].to_padded_tensor(padding=0.0),
            mask, uids, str(self.config.actor_rollout_ref.actor.loss_agg_mode),
        )
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({"advantages": response_to_nested(scaled, nested_mask)},
                                          batch_size=len(batch)))
        metrics.update(zv_metrics)

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
        weights = codapo_book().last_weights
        if self.codapo_active and weights is not None and len(weights) == len(batch.keys):
            fields["codapo_weight"] = np.asarray(weights, dtype=float).tolist()
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
