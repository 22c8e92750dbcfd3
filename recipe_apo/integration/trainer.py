"""The recipe's trainers: verl's V1 trainers running the recipe's hooks at verl's hand-off points.

One per verl mode, registered with verl under the recipe's names (``recipe_apo.integration.modes``):
``apo_sync`` (verl's ``sync``), ``apo_colocate_async`` and ``apo_separate_async``; the launch maps the mode a user
names to the recipe's. verl picks the trainer class by that name and switches its asynchronous code paths on
the exact mode string, so each class sets the mode back to verl's own before verl reads it, and every step runs
exactly as verl's own trainer of that mode runs it.

The hand-off points, each calling every active hook (``recipe_apo.integration.hooks``) in order:

- ``__init__``: the hooks the config wants are built (e.g. a fresh APO anchor for the run);
- ``_load_checkpoint``: after verl's restore, ``hook.restored(folder, step)``;
- ``_save_checkpoint``: before verl's save (which ends by marking the folder latest), ``hook.save(folder, step)``;
- ``step``: ``hook.begin_step()``, then verl's step (its ``parameter_sync_step`` mini-batches, each with its own
  advantage step), then ``hook.end_step(metrics)`` (APO's anchor moves once per training step);
- ``_next_train_batch``: the first ``hook.replace_batch(n)`` that returns prompts, else verl's dataloader and
  then ``hook.drew_batch(batch)``;
- ``_compute_advantage``: the step's trajectories parsed once from its keys (``multi_output.Sessions``); verl's
  advantage step inside the final-output rule for ``apo``/``codapo`` (``multi_output.final_output_rule``: with
  a multi-output agent loop each trajectory's final output stands for it, as verl does for ``grpo``) and every
  ``hook.around_advantage(batch, sessions)``, then ``hook.after_advantage(batch, metrics, sessions)``;
- ``_update_actor``: after verl's actor update of a batch, ``hook.after_update(batch, metrics)`` (AGPO's step
  KL reads the updated policy there);
- ``_log_rollout_data``: verl's rollout dump with every ``hook.dump_fields(batch)`` as extra columns (a hook
  whose columns fail is named in a warning; the others' columns still go out).

``RecipeHooks`` holds all of that for any verl V1 trainer class; a trainer for another verl mode is
``class X(RecipeHooks, VerlTrainer)`` with that mode's name in ``VERL_MODE``, registered under a name of its own.
"""

from __future__ import annotations

import contextlib
import os

from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from recipe_apo.integration.hooks import HOOKS
from recipe_apo.integration.modes import RECIPE_TRAINERS
from recipe_apo.integration.multi_output import Sessions, final_output_rule

TRAINER_NAME = RECIPE_TRAINERS["sync"]


class RecipeHooks:
    """The hand-off points of the module docstring, on top of a verl V1 trainer class (put it first)."""

    VERL_MODE = "sync"

    def __init__(self, config: DictConfig) -> None:
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.VERL_MODE
        super().__init__(config)
        self._start_hooks(config)

    def _start_hooks(self, config: DictConfig) -> None:
        self.hooks = [hook(self, config) for hook in HOOKS if hook.wanted(config)]

    def hook(self, kind: type):
        """The active hook of class ``kind``, or None."""
        return next((h for h in self.hooks if isinstance(h, kind)), None)

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        folder = self._resumed_folder()
        for hook in self.hooks:
            hook.restored(folder, self.global_steps)
        return result

    def _resumed_folder(self):
        """The folder verl just resumed from, read off the step it restored (None: a fresh start)."""
        if self.global_steps == 0:
            return None
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            return os.path.abspath(str(trainer.resume_from_path))
        return os.path.join(os.path.abspath(str(trainer.default_local_dir)), f"global_step_{self.global_steps}")

    def _save_checkpoint(self):
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        for hook in self.hooks:
            hook.save(folder, self.global_steps)
        return super()._save_checkpoint()

    def step(self, metrics: dict, timing_raw: dict):
        for hook in self.hooks:
            hook.begin_step()
        batch = super().step(metrics, timing_raw)
        for hook in self.hooks:
            hook.end_step(metrics)
        return batch

    def _next_train_batch(self, num_prompts=None):
        size = num_prompts or int(self.config.data.train_batch_size)
        for hook in self.hooks:
            batch = hook.replace_batch(size)
            if batch is not None:
                return batch
        batch = super()._next_train_batch(num_prompts)
        for hook in self.hooks:
            hook.drew_batch(batch)
        return batch

    def _compute_advantage(self, batch, metrics: dict):
        sessions, tags = Sessions.of(batch.keys), batch.tags  # verl's write-back returns a handle without tags
        with contextlib.ExitStack() as stack:
            stack.enter_context(final_output_rule(self.config.algorithm.adv_estimator, sessions))
            for hook in self.hooks:
                stack.enter_context(hook.around_advantage(batch, sessions))
            batch = super()._compute_advantage(batch, metrics)
        for hook in self.hooks:
            hook.after_advantage(batch, metrics, sessions)
        metrics.update(sessions.metrics(tags))
        return batch

    def _update_actor(self, batch, metrics: dict):
        batch = super()._update_actor(batch, metrics)
        for hook in self.hooks:
            hook.after_update(batch, metrics)
        return batch

    def _dump_fields(self, batch) -> dict[str, list]:
        """Every hook's dump columns; a hook that fails loses its own (a diagnostic must not stop training),
        said once per run and hook."""
        fields = {}
        for hook in self.hooks:
            try:
                fields.update(hook.dump_fields(batch))
            except Exception as exc:
                warned = self.__dict__.setdefault("_dump_fields_failed", set())
                if type(hook).__name__ not in warned:
                    warned.add(type(hook).__name__)
                    print(f"recipe-apo: warning: rollout dump without {type(hook).__name__}'s fields "
                          f"({type(exc).__name__}: {exc}); said once per run", flush=True)
        return fields

    def _log_rollout_data(self, batch, timing_raw, rollout_data_dir):
        fields = self._dump_fields(batch)
        if not fields:
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


@register_trainer(TRAINER_NAME)
class ApoSyncTrainer(RecipeHooks, PPOTrainerSync):
    """verl's synchronous V1 trainer with the recipe's hooks."""


@register_trainer(RECIPE_TRAINERS["colocate_async"])
class ApoColocateAsyncTrainer(RecipeHooks, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer (partial rollouts across weight updates) with the recipe's hooks."""

    VERL_MODE = "colocate_async"


@register_trainer(RECIPE_TRAINERS["separate_async"])
class ApoSeparateAsyncTrainer(RecipeHooks, PPOTrainerSeparateAsync):
    """verl's asynchronous trainer on separate rollout and training pools with the recipe's hooks."""

    VERL_MODE = "separate_async"
