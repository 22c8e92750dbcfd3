"""The recipe's trainers: verl's V1 trainers driving the active methods' runtimes at verl's hand-off points.

One per verl mode, registered with verl under the recipe's names (``recipe_apo.integration.modes``):
``apo_sync`` (verl's ``sync``), ``apo_colocate_async`` and ``apo_separate_async``; the launch maps the mode a user
names to the recipe's. verl picks the trainer class by that name and switches its asynchronous code paths on
the exact mode string, so each class sets the mode back to verl's own before verl reads it, and every step runs
exactly as verl's own trainer of that mode runs it.

This is one of the two adapters of the methods' runtimes (``recipe_apo.methods.base``; the other is the CPU
testbed's). It names no method: it builds the runtimes of the methods a config activates
(``recipe_apo.methods.catalog``) and calls each, in catalog order, at verl's hand-offs:

- ``__init__``: fresh runtimes for the run, their estimators' states kept in the driver process
  (``recipe_apo.methods.handoff``; again after a restore and after each ``begin_step``);
- ``_load_checkpoint``: after verl's restore, the actor workers' loss gets the methods' loss columns
  (``verl_access.install_column_loss``), and each runtime its state from the folder verl resumed from
  (``recipe_apo.integration.checkpoint``);
- ``_save_checkpoint``: before verl's save (which ends by marking the folder latest), each runtime's state;
- ``step``: ``begin_step``, verl's step (its ``parameter_sync_step`` mini-batches, each with its own advantage
  step), then ``end_step``'s metrics;
- ``_next_train_batch``: the first runtime's ``replace_prompts`` or verl's dataloader, then every runtime's
  ``drew_prompts`` (a probe runs through ``TrainerHost``); per-prompt sampling settings send every prompt through
  the ``recipe_sampling`` agent loop;
- ``_compute_advantage``: the step's trajectories parsed once from its keys (``multi_output.Sessions``); verl's
  advantage step inside the final-output rule for the recipe's estimators and ``handoff.advantage_step`` (every
  ``estimator_inputs`` handed, the estimators' results collected); then ``after_advantage``: metrics, new advantages
  and loss columns written back, dump columns kept;
- ``_compute_old_log_prob``, ``_compute_ref_log_prob``, ``_update_actor``: before each of verl's passes of the
  policy, the runtimes' ``actor_call`` (the logits head of the pass, an optimizer restart) in the batch's metadata
  (``verl_access.hand_actor_call``; the actor's workers read it: ``recipe_apo.integration.model_classes``);
- ``_update_actor``: after verl's update of a batch, ``after_update``;
- ``_log_rollout_data``: verl's rollout dump with the audit's and the methods' columns (a failure of those is
  named in a warning, once per run; the dump still goes out);
- ``_val_metrics_update``: beside verl's validation metrics, the unbiased pass@k (``pass_at_k``; verl's
  ``best@k`` is biased low);
- ``_build_replay_buffer`` and ``step``: the group filter's refills capped at
  ``algorithm.filter_groups.max_num_gen_batches`` per step (``recipe_apo.integration.refill_cap``), which verl
  0.9.1 ignores.

verl's trainer internals touched on the way are all in ``recipe_apo.integration.verl_access``.
``RecipeHooks`` holds all of that for any verl V1 trainer class; a trainer for another verl mode is
``class X(RecipeHooks, VerlTrainer)`` with that mode's name in ``VERL_MODE``, registered under a name of its own.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

from omegaconf import DictConfig, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from recipe_apo.integration import pass_at_k, verl_access
from recipe_apo.integration.checkpoint import restore_state, save_state
from recipe_apo.integration.modes import RECIPE_TRAINERS
from recipe_apo.integration.multi_output import Sessions, final_output_rule
from recipe_apo.integration.refill_cap import RefillCap
from recipe_apo.integration.rollout_dump import AuditFields, RowColumns
from recipe_apo.methods import catalog, handoff
from recipe_apo.methods.base import ActorCall, MethodRuntime, Probe, Prompts, StepBatch

TRAINER_NAME = RECIPE_TRAINERS["sync"]


class TrainerHost:
    """What a runtime asks of verl's trainer (``recipe_apo.methods.base.Host``)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.batch = None  # the batch handle of the update under way (``after_update``)

    def probe(self, prompts: Prompts, samples: int, temperature: float, answer_key: Callable[[str], str]) -> Probe:
        with verl_access.timed(self.trainer, "recipe_probe"):  # timing_s/recipe_probe: not in verl's gen
            return verl_access.probe(self.trainer, prompts, samples, temperature, answer_key)

    def policy_log_probs(self) -> Any:
        with verl_access.timed(self.trainer, "recipe_policy_log_probs"):
            return verl_access.policy_log_probs(self.trainer, self.batch)


def _overrides(runtime: MethodRuntime, name: str) -> bool:
    return getattr(type(runtime), name) is not getattr(MethodRuntime, name)


class RecipeHooks:
    """The hand-off points of the module docstring, on top of a verl V1 trainer class (put it first)."""

    VERL_MODE = "sync"
    refill_cap = None  # the group filter's cap, when the run has one (``_build_replay_buffer``)

    def __init__(self, config: DictConfig) -> None:
        with open_dict(config):
            config.trainer.v1.trainer_mode = self.VERL_MODE
        super().__init__(config)
        self._start_runtimes(config)

    def _start_runtimes(self, config: DictConfig) -> None:
        self.methods = catalog.active(config)
        self.runtimes = [r for r in (m.build_runtime(config) for m in self.methods) if r is not None]
        handoff.keep_estimator_states(self.runtimes)
        self.host = TrainerHost(self)
        self.dump_columns = RowColumns()
        self.audit_fields = AuditFields(self, config)
        self.loss_columns = tuple(column for m in self.methods for column in m.loss_columns)
        self.samples_per_prompt = any(m.prompt_columns for m in self.methods)
        self.needs = frozenset().union(*(r.needs for r in self.runtimes))

    def _readers(self) -> str:
        """The methods whose runtimes read each row's data source, as an error names them."""
        return "method " + ", ".join(r.method.name for r in self.runtimes if "data_sources" in r.needs)

    def runtime(self, name: str):
        """The run's runtime of the method ``name``, or None."""
        return next((r for r in self.runtimes if r.method.name == name), None)

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.loss_columns:
            verl_access.install_column_loss(self, self.loss_columns)
        folder = self._resumed_folder()
        if folder is not None:
            for runtime in self.runtimes:
                restore_state(runtime, folder, self.global_steps)
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
        for runtime in self.runtimes:
            save_state(runtime, folder, self.global_steps)
        return super()._save_checkpoint()

    def _build_replay_buffer(self):
        cap = RefillCap.from_config(self.config)
        if cap is None:
            return super()._build_replay_buffer()
        with verl_access.cap_warning_dropped():
            buffer = super()._build_replay_buffer()
        if verl_access.cap_refills(buffer, cap):
            self.refill_cap = cap
            print(cap.announcement(), flush=True)
        else:
            print(f"recipe-apo: warning: {type(buffer).__name__}, the run's sampler, has no group filter of verl's "
                  "own: algorithm.filter_groups.max_num_gen_batches is left to it", flush=True)
        return buffer

    def step(self, metrics: dict, timing_raw: dict):
        if self.refill_cap is not None:
            self.refill_cap.begin_step(self.global_steps)
        for runtime in self.runtimes:
            runtime.begin_step(self.global_steps)
        handoff.keep_estimator_states(self.runtimes)
        batch = super().step(metrics, timing_raw)
        for runtime in self.runtimes:
            metrics.update(runtime.end_step(self.global_steps))
        return batch

    def _next_train_batch(self, num_prompts=None):
        size = num_prompts or int(self.config.data.train_batch_size)
        step = self.global_steps
        batch = None
        for runtime in self.runtimes:
            table = runtime.replace_prompts(step, size)
            if table is not None:
                batch = verl_access.prompt_batch(table, step)
                break
        if batch is None:
            batch = super()._next_train_batch(num_prompts)
        prompts = verl_access.prompts_of(batch)
        settings = {}
        for runtime in self.runtimes:
            settings.update(runtime.drew_prompts(step, prompts, self.host))
        if self.samples_per_prompt:
            verl_access.route_sampling(batch, settings,
                                       str(self.config.actor_rollout_ref.rollout.agent.default_agent_loop))
        return batch

    def _compute_advantage(self, batch, metrics: dict):
        sessions, tags = Sessions.of(batch.keys), batch.tags  # verl's write-back returns a handle without tags
        step_batch, nested_mask = (verl_access.step_batch(batch, sessions, self.needs, self._readers())
                                   if self.runtimes else (None, None))
        with contextlib.ExitStack() as stack:
            estimator = self.config.algorithm.adv_estimator
            stack.enter_context(verl_access.multi_trajectory_advantage_replaced(
                final_output_rule(estimator, sessions), estimator))
            if self.runtimes:
                stack.enter_context(handoff.advantage_step(self.runtimes, step_batch))
            batch = super()._compute_advantage(batch, metrics)
        if self.runtimes:
            self._after_advantage(batch, step_batch, nested_mask, metrics)
        metrics.update(sessions.metrics(tags))
        return batch

    def _after_advantage(self, batch, step_batch: StepBatch, nested_mask, metrics: dict) -> None:
        if "advantages" in self.needs:
            step_batch.advantages = verl_access.read(batch, ["advantages"])["advantages"].to_padded_tensor(
                padding=0.0)
        changed, dump, loss_columns = False, {}, {}
        for runtime in self.runtimes:
            out = runtime.after_advantage(self.global_steps, step_batch)
            if out.advantages is not None:
                step_batch.advantages, changed = out.advantages, True
            metrics.update(out.metrics)
            dump.update(out.dump)
            loss_columns.update(out.loss_columns)
        if changed:
            verl_access.write_padded(batch, {"advantages": step_batch.advantages}, nested_mask)
        if loss_columns:
            verl_access.add_row_columns(batch, loss_columns)
        self.dump_columns.add(self.global_steps, batch.keys, dump)
        self._last_advantage_step = (list(batch.keys), step_batch)

    def _hand_actor_call(self, batch, call: str) -> None:
        asked = ActorCall.of([r.actor_call(self.global_steps, call) for r in self.runtimes])
        if asked is not None:
            verl_access.hand_actor_call(batch, asked.logits_head,
                                        self.global_steps if asked.restart_optimizer else -1)

    def _compute_old_log_prob(self, batch, metrics: dict):
        self._hand_actor_call(batch, "old_log_probs")
        return super()._compute_old_log_prob(batch, metrics)

    def _compute_ref_log_prob(self, batch, metrics: dict):
        self._hand_actor_call(batch, "ref_log_probs")
        return super()._compute_ref_log_prob(batch, metrics)

    def _update_actor(self, batch, metrics: dict):
        self._hand_actor_call(batch, "update")
        batch = super()._update_actor(batch, metrics)
        updating = [r for r in self.runtimes if _overrides(r, "after_update")]
        if updating:
            keys, step_batch = getattr(self, "_last_advantage_step", (None, None))
            if keys != list(batch.keys):  # not the batch of the last advantage step: read it afresh
                step_batch, _ = verl_access.step_batch(batch, Sessions.of(batch.keys), self.needs, self._readers())
            self.host.batch = batch
            for runtime in updating:
                runtime.after_update(self.global_steps, step_batch, self.host)
        return batch

    def _dump_fields(self, batch) -> dict[str, list]:
        """The audit's and the methods' dump columns; a source that fails loses its own (a diagnostic must not
        stop training), said once per run and source."""
        fields = {}
        sources = (("the audit's", lambda: self.audit_fields(batch)),
                   ("the methods'", lambda: self.dump_columns.for_rows(batch.keys)))
        for name, source in sources:
            try:
                fields.update(source())
            except Exception as exc:
                warned = self.__dict__.setdefault("_dump_fields_failed", set())
                if name not in warned:
                    warned.add(name)
                    print(f"recipe-apo: warning: rollout dump without {name} fields "
                          f"({type(exc).__name__}: {exc}); said once per run", flush=True)
        return fields

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, *args, **kwargs):
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, *args, **kwargs)
        metrics.update(pass_at_k.validation_metrics(data_sources, sample_uids, reward_extra_infos_dict,
                                                    kwargs.get("expected_acc_counts")))
        return metrics

    def _log_rollout_data(self, batch, timing_raw, rollout_data_dir):
        with verl_access.dumping_with(self, batch, self._dump_fields(batch)):
            return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)


@register_trainer(TRAINER_NAME)
class RecipeSyncTrainer(RecipeHooks, PPOTrainerSync):
    """verl's synchronous V1 trainer with the recipe's methods."""


@register_trainer(RECIPE_TRAINERS["colocate_async"])
class RecipeColocateAsyncTrainer(RecipeHooks, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer (partial rollouts across weight updates) with the recipe's methods."""

    VERL_MODE = "colocate_async"


@register_trainer(RECIPE_TRAINERS["separate_async"])
class RecipeSeparateAsyncTrainer(RecipeHooks, PPOTrainerSeparateAsync):
    """verl's asynchronous trainer on separate rollout and training pools with the recipe's methods."""

    VERL_MODE = "separate_async"
