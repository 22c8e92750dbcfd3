"""AGPO's two controllers in verl's loop (``method=agpo_dual``; the maths: ``recipe_apo.methods.agpo_dual``).

At verl's hand-offs, in ``trainer.v1.trainer_mode=sync`` (the launch refuses the async modes):

- ``restored``: the actor workers get ``BatchClipLoss`` (verl's ``ppo_loss`` with the batch's per-row clip
  handed to the ``agpo_clip`` loss) through verl's ``set_loss_fn``; on resume U_bar, H_ref and KL_bar come
  back from ``global_step_N/agpo_state.json`` (a missing or foreign file stops the resume with one line).
- ``drew_batch`` (the step's prompts, before verl submits them): **the probe**. The prompts go to verl's
  rollout once more, each ``probe_samples`` times at ``base_temperature``, on verl's validation path (partition
  ``val``, as ``_validate`` runs it, so the probe never mixes with training rollouts; top_p/top_k are the
  training rollout's), are scored by the run's reward, and are dropped after their statistics are taken: the
  rewards give sigma_p and kappa, the answers (``algorithm.agpo.vote_key``) H_v. U moves U_bar and gives each
  prompt its tau_t, a batch column that the ``agpo_tempered`` agent loop turns into the prompt's sampling
  temperature (``recipe_apo.integration.tempered_loop``). The probe's response tokens are counted in
  ``agpo/probe_tokens``, not in verl's ``response_length/*`` (those are the training rollout's).
- ``after_advantage`` (old log-probs and their token entropies are in the batch): H_pi per prompt, eps_p,
  and the column ``agpo_clip_eps`` written into the batch for the loss.
- ``after_update``: the updated policy's log-probs of the batch (one more forward pass) give step_KL.
- ``end_step``: KL_bar moves once per training step (the mean step_KL of its updates), and the ``agpo/``
  metrics: mean and std of tau_t and eps, U, U_bar, H_v, sigma_p, H_pi / H_ref, KL_bar, probe tokens.
- ``save``: ``global_step_N/agpo_state.json``.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.integration import batch_fields
from recipe_apo.integration.agpo_launch import INNER_KEY, TEMPERATURE_KEY, TEMPERED_LOOP, uses_agpo
from recipe_apo.integration.batch_clip_loss import COLUMN, BatchClipLoss, actor_loss_config
from recipe_apo.integration.checkpoint import write_json_atomically
from recipe_apo.integration.errors import cause_of
from recipe_apo.integration.hooks.base import RowColumns, TrainerHook
from recipe_apo.integration.multi_output import Sessions
from recipe_apo.methods.agpo_dual import AgpoSettings, AgpoState, ProbeStats, pooled_entropy, step_kl
from recipe_apo.methods.errors import MethodStateError
from recipe_apo.reward.vote_keys import load_vote_key

logger = logging.getLogger("recipe_apo")
STATE_FILE = "agpo_state.json"
STATE_KIND = "agpo_dual"
STAT_FIELDS = ("dispersion", "vote_entropy", "skewness")


class AgpoStateError(MethodStateError):
    """A resume cannot restore AGPO's controller state; the message names the file and the cause."""


def save_state(folder: str, step: int, state: AgpoState) -> str:
    return write_json_atomically(folder, STATE_FILE, {"kind": STATE_KIND, "global_step": int(step),
                                                      **state.state_dict()})


def load_state(folder: str) -> AgpoState:
    """The controller state of ``folder/agpo_state.json``; ``AgpoStateError`` in one line when it is missing,
    unreadable or not AGPO's."""
    path = os.path.join(folder, STATE_FILE)
    try:
        if not os.path.exists(path):
            raise AgpoStateError("it is missing")
        with open(path) as handle:
            payload = json.load(handle)
        if not isinstance(payload, dict) or payload.get("kind") != STATE_KIND:
            kind = payload.get("kind") if isinstance(payload, dict) else type(payload).__name__
            raise AgpoStateError(f"it is not AGPO's controller state (kind {kind!r})")
        state = AgpoState()
        state.load_state_dict({key: payload.get(key) for key in payload if key not in ("kind", "global_step")})
    except AgpoStateError as exc:
        raise AgpoStateError(f"cannot resume AGPO's controllers from {path}: {exc}") from None
    except (OSError, ValueError, TypeError, RecursionError, MethodStateError) as exc:
        raise AgpoStateError(f"cannot resume AGPO's controllers from {path}: it cannot be read "
                             f"({cause_of(exc)})") from None
    return state


def _spread(values: np.ndarray) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    return (float(values.mean()), float(values.std())) if values.size else (0.0, 0.0)


class AgpoHook(TrainerHook):
    @classmethod
    def wanted(cls, config: Any) -> bool:
        return uses_agpo(config)

    def __init__(self, trainer: Any, config: Any) -> None:
        super().__init__(trainer, config)
        self.settings = AgpoSettings.from_algorithm_config(config.algorithm)
        self.vote_key = load_vote_key(self.settings.vote_key)
        self.state = AgpoState()
        self.begin_step()
        self.columns = RowColumns()

    # ---- the run ---------------------------------------------------------------------------------------------
    def restored(self, folder: Optional[str], step: int) -> None:
        self.trainer.actor_rollout_wg.set_loss_fn(BatchClipLoss(actor_loss_config(self.config)))
        if step > 0:
            self.state = load_state(folder)
            logger.info("recipe-apo: restored AGPO's controllers from %s: %s", folder, self.state.state_dict())

    def save(self, folder: str, step: int) -> None:
        save_state(folder, step, self.state)

    def begin_step(self) -> None:
        self.step_metrics, self.step_kls = {}, []
        self.prompts: dict[str, int] = {}  # prompt uid -> position in the step's probe arrays
        self.stats: Optional[ProbeStats] = None
        self.probe_tokens = 0
        self.temperature, self.uncertainty = np.zeros(0), np.zeros(0)

    def end_step(self, metrics: dict) -> None:
        if self.step_kls:
            self.state.add_step_kl(float(np.mean(self.step_kls)), self.settings)
            self.step_metrics["agpo/step_kl"] = float(np.mean(self.step_kls))
        self.step_metrics["agpo/kl_avg"] = self.state.kl_avg
        self.step_metrics["agpo/uncertainty_avg"] = self.state.uncertainty_avg
        self.step_metrics["agpo/entropy_ref"] = self.state.entropy_ref
        metrics.update(self.step_metrics)

    # ---- the probe -------------------------------------------------------------------------------------------
    def drew_batch(self, batch: Any) -> None:
        from verl.utils import tensordict_utils as tu
        from verl.utils.debug import marked_timer

        uids = [str(u) for u in batch["uid"]]
        with marked_timer("agpo_probe", self.trainer.timing_raw):  # timing_s/agpo_probe: not in verl's gen
            rewards, keys, tokens = self._probe(batch)
        stats = ProbeStats.of(rewards, keys, self.settings.dispersion)
        uncertainty = stats.uncertainty(self.settings)
        temperature, _ = self.state.temperatures(uncertainty, self.settings)
        # A step may draw more than once (verl refills failed groups): every drawn prompt keeps its statistics.
        start = len(self.prompts)
        self.prompts.update({uid: start + j for j, uid in enumerate(uids)})
        self.stats = stats if self.stats is None else ProbeStats(
            *(np.concatenate([getattr(self.stats, f), getattr(stats, f)]) for f in STAT_FIELDS))
        self.temperature = np.concatenate([self.temperature, temperature])
        batch[TEMPERATURE_KEY] = torch.as_tensor(temperature, dtype=torch.float32)
        self._route_through_tempered_loop(batch, tu)
        self.probe_tokens += tokens
        self.uncertainty = np.concatenate([self.uncertainty, uncertainty])
        tau_mean, tau_std = _spread(self.temperature)
        self.step_metrics.update({
            "agpo/temperature_mean": tau_mean, "agpo/temperature_std": tau_std,
            "agpo/uncertainty_mean": float(self.uncertainty.mean()),
            "agpo/vote_entropy_mean": float(self.stats.vote_entropy.mean()),
            "agpo/dispersion_mean": float(self.stats.dispersion.mean()),
            "agpo/probe_tokens": float(self.probe_tokens),
        })

    def _route_through_tempered_loop(self, batch: Any, tu: Any) -> None:
        """Every prompt runs its own agent loop inside ``agpo_tempered``, which applies its temperature."""
        inner = [str(name) for name in batch["agent_name"]] if "agent_name" in batch.keys() else None
        default = str(self.config.actor_rollout_ref.rollout.agent.default_agent_loop)
        tu.assign_non_tensor_stack(batch, INNER_KEY, inner or [default] * len(batch))
        tu.assign_non_tensor_stack(batch, "agent_name", [TEMPERED_LOOP] * len(batch))

    def _probe(self, batch: Any) -> tuple[np.ndarray, list[list[str]], int]:
        """Generate and score ``probe_samples`` responses per prompt of ``batch`` on verl's validation path, as
        ``_validate`` does; their rewards (prompts x samples), answer keys and response token count."""
        import transfer_queue as tq
        from verl.utils import tensordict_utils as tu

        trainer, n, samples = self.trainer, len(batch), self.settings.probe_samples
        probe = tu.index_select_tensor_dict(batch, torch.arange(n))
        probe_uids = [str(uuid.uuid4()) for _ in range(n)]
        tu.assign_non_tensor_stack(probe, "uid", probe_uids)
        tu.assign_non_tensor_stack(probe, "__rollout_n__", [samples] * n)
        probe[TEMPERATURE_KEY] = torch.full((n,), float(self.settings.base_temperature))
        self._route_through_tempered_loop(probe, tu)
        tu.assign_non_tensor_data(probe, "global_steps", trainer.global_steps)
        tu.assign_non_tensor_data(probe, "validate", True)
        tags = [{"is_prompt": True, "status": "pending", "global_steps": trainer.global_steps} for _ in range(n)]
        tq.kv_batch_put(keys=probe_uids, partition_id="val", tags=tags)
        trainer.agent_loop_manager.generate_sequences(probe)
        meta, _ = trainer.replay_buffer.sample(global_steps=trainer.global_steps, partition_id="val", batch_size=n)
        try:
            if trainer.reward_loop_manager.reward_loop_worker_handles is None:
                trainer.checkpoint_manager.sleep_replicas()
                meta = trainer._compute_reward_colocate(meta)
                trainer.checkpoint_manager.update_weights()
            sessions = Sessions.of(meta.keys)
            finals = [key for key, final in zip(meta.keys, sessions.is_final) if final]
            data = tq.kv_batch_get(keys=finals, partition_id=meta.partition_id,
                                   select_fields=["uid", "rm_scores", "responses", "response_mask"])
            tokens = int(tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id,
                                         select_fields=["response_mask"])["response_mask"].values().sum())
        finally:
            tq.kv_clear(keys=meta.keys, partition_id=meta.partition_id)
        scores = data["rm_scores"].to_padded_tensor(padding=0.0).sum(dim=-1).double().numpy()
        mask = data["response_mask"].to_padded_tensor(padding=0).bool()
        responses = data["responses"].to_padded_tensor(padding=0)
        texts = trainer.tokenizer.batch_decode([row[m].tolist() for row, m in zip(responses, mask)],
                                               skip_special_tokens=True)
        owner = {uid: j for j, uid in enumerate(probe_uids)}
        rows = np.array([owner[str(uid)] for uid in data["uid"]], dtype=np.int64)
        grouped, keys = self._by_prompt(rows, scores, [self.vote_key(text) for text in texts], n, samples)
        return grouped, keys, tokens

    @staticmethod
    def _by_prompt(rows: np.ndarray, scores: np.ndarray, keys: list[str], n: int, samples: int):
        """(n, samples) rewards and n lists of keys from per-response arrays (each prompt's responses in their
        order); a prompt whose every response failed in verl's rollout is refused by name."""
        counts = np.bincount(rows, minlength=n)
        if (counts != samples).any():
            prompt = int(np.flatnonzero(counts != samples)[0])
            raise MethodStateError(f"AGPO's probe: prompt {prompt} of the step came back with {counts[prompt]} of "
                                   f"algorithm.agpo.probe_samples={samples} responses")
        order = np.argsort(rows, kind="stable")
        grouped = scores[order].reshape(n, samples)
        key_rows = np.array(keys, dtype=object)[order].reshape(n, samples).tolist()
        return grouped, key_rows

    # ---- the clip --------------------------------------------------------------------------------------------
    def after_advantage(self, batch: Any, metrics: dict, sessions: Sessions) -> None:
        from tensordict import TensorDict

        data = batch_fields.read(batch, ["uid", "entropy", "response_mask"])
        entropy = data["entropy"].to_padded_tensor(padding=0.0)
        mask = data["response_mask"].to_padded_tensor(padding=0)
        uids = np.array([str(u) for u in data["uid"]], dtype=object)
        order = list(self.prompts)
        h_pi = pooled_entropy(entropy, mask, uids, order)
        rows = np.array([self.prompts[u] for u in uids.tolist()], dtype=np.int64)
        present = np.unique(rows)
        stats = ProbeStats(*(getattr(self.stats, f)[present] for f in STAT_FIELDS))
        eps, ratio = self.state.clips(h_pi[present], stats, self.settings)
        per_prompt = np.zeros(len(order))
        per_prompt[present] = eps
        column = torch.as_tensor(per_prompt[rows], dtype=torch.float32)
        written = tq_put(batch, TensorDict({COLUMN: column}, batch_size=len(batch)))
        if batch.fields is not None:
            # verl's update fetches the fields its batch handle lists: the handle must list the new column.
            batch.fields = list(written.fields)
        eps_mean, eps_std = _spread(eps)
        self.step_metrics.update({"agpo/clip_eps_mean": eps_mean, "agpo/clip_eps_std": eps_std,
                                  "agpo/entropy_ratio_mean": float(np.mean(ratio))})
        self.columns.add(self.trainer.global_steps, sessions,
                         {"agpo_temperature": sessions.finals(self.temperature[rows]),
                          "agpo_clip_eps": sessions.finals(per_prompt[rows])})

    # ---- KL_bar ----------------------------------------------------------------------------------------------
    def after_update(self, batch: Any, metrics: dict) -> None:
        from verl.utils.debug import marked_timer
        from verl.workers.utils.padding import response_from_nested

        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                 "temperature": self.config.actor_rollout_ref.rollout.temperature})
        with marked_timer("agpo_step_kl", self.trainer.timing_raw):  # timing_s/agpo_step_kl
            self.trainer.actor_rollout_wg.compute_log_prob(batch)
        data = batch_fields.read(batch, ["uid", "log_probs", "old_log_probs", "response_mask"])
        new = response_from_nested(data["log_probs"], data["response_mask"]).to_padded_tensor(padding=0.0)
        old = data["old_log_probs"].to_padded_tensor(padding=0.0)
        mask = data["response_mask"].to_padded_tensor(padding=0)
        uids = np.array([str(u) for u in data["uid"]], dtype=object)
        self.step_kls.append(step_kl(old, new, mask, uids))

    def dump_fields(self, batch: Any) -> dict[str, list]:
        return self.columns.for_rows(batch.keys)


def tq_put(batch: Any, fields: Any) -> Any:
    import transfer_queue as tq

    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
