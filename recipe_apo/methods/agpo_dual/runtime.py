"""AGPO's two controllers over a run (the maths and its symbols: ``controllers``). A step, as the source's:

1. ``drew_prompts``: **the probe**. The host generates ``probe_samples`` (G) responses to each drawn prompt at
   ``base_temperature``, scores them and drops them; their rewards give sigma_p and kappa, their answers
   (``algorithm.agpo_dual.vote_key``, or the testbed task's own answers) H_v. U moves U_bar prompt by prompt and gives
   each prompt its tau_t, returned as the prompt's sampling ``temperature`` for its training rollout. A step may
   draw more than once (verl refills failed groups): every drawn prompt keeps its statistics.
2. ``after_advantage``: H_pi per prompt, the old policy's token entropy pooled over the prompt's training
   responses, gives eps_p (moving H_ref); every row gets its prompt's eps as the loss column ``agpo_dual_clip_eps``.
3. ``after_update``: step_KL of the step's responses, the old log-probs against the updated policy's (the host's
   forward pass).
4. ``end_step``: KL_bar moves once per training step (the mean step_KL of its updates); ``agpo_dual/*`` metrics.

The state (U_bar, H_ref, KL_bar) is ``agpo_dual_state.json`` in every checkpoint (an older checkpoint's
``agpo_state.json`` is read too); a resume without it stops.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from recipe_apo.methods.agpo_dual import CLIP_COLUMN, METHOD
from recipe_apo.methods.agpo_dual.controllers import AgpoDualState, ProbeStats, pooled_entropy, step_kl
from recipe_apo.methods.agpo_dual.launch import check_temperature
from recipe_apo.methods.agpo_dual.settings import AgpoDualSettings
from recipe_apo.methods.agpo_dual.vote_keys import load_vote_key
from recipe_apo.methods.base import Host, MethodRuntime, Prompts, StepBatch, StepOutput
from recipe_apo.methods.errors import BatchInputError, MethodStateError

STAT_FIELDS = ("dispersion", "vote_entropy", "skewness")


class AgpoDualStateError(MethodStateError):
    """A resume cannot restore AGPO's controller state; the message names the file and the cause."""


def _spread(values: np.ndarray) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    return (float(values.mean()), float(values.std())) if values.size else (0.0, 0.0)


@METHOD.runtime
class AgpoDualRuntime(MethodRuntime):
    needs = frozenset({"old_log_probs", "entropy"})
    # Its state file holds three numbers, about 150 bytes: a larger one is not what the recipe wrote.
    state_max_bytes = 64 * 2**10

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.settings = AgpoDualSettings.from_algorithm_config(config.algorithm)
        check_temperature(config, self.settings)
        self.vote_key = load_vote_key(self.settings.vote_key)
        key = self.settings.vote_key
        self.custom_answer_key = None if key is None else f"algorithm.agpo_dual.vote_key={key}"
        self.state = AgpoDualState()
        self.begin_step(0)

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self, step: int) -> dict:
        return self.state.state_dict()

    def load_state_dict(self, state: dict, step: int) -> None:
        restored = AgpoDualState()
        restored.load_state_dict(state)
        self.state = restored

    def state_needed(self, step: int) -> bool:
        return step > 0

    def state_unreadable(self, path: str, reason: str, step: int) -> None:
        raise AgpoDualStateError(f"cannot resume AGPO's controllers from {path}: {reason}")

    # ---- the step -------------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.metrics: dict[str, float] = {}
        self.step_kls: list[float] = []
        self.prompts: dict[Any, int] = {}  # prompt uid -> position in the step's probe arrays
        self.stats: Optional[ProbeStats] = None
        self.probe_tokens = 0
        self.temperature, self.uncertainty = np.zeros(0), np.zeros(0)

    def drew_prompts(self, step: int, prompts: Prompts, host: Host) -> dict[str, np.ndarray]:
        settings = self.settings
        probe = host.probe(prompts, settings.probe_samples, float(settings.base_temperature), self.vote_key)
        stats = ProbeStats.of(probe.rewards, probe.keys, settings.dispersion)
        uncertainty = stats.uncertainty(settings)
        temperature, _ = self.state.temperatures(uncertainty, settings)
        start = len(self.prompts)
        self.prompts.update({uid: start + j for j, uid in enumerate(prompts.uids.tolist())})
        self.stats = stats if self.stats is None else ProbeStats(
            *(np.concatenate([getattr(self.stats, f), getattr(stats, f)]) for f in STAT_FIELDS))
        self.temperature = np.concatenate([self.temperature, temperature])
        self.uncertainty = np.concatenate([self.uncertainty, uncertainty])
        self.probe_tokens += int(probe.tokens)
        tau_mean, tau_std = _spread(self.temperature)
        self.metrics.update({
            "agpo_dual/temperature_mean": tau_mean, "agpo_dual/temperature_std": tau_std,
            "agpo_dual/uncertainty_mean": float(self.uncertainty.mean()),
            "agpo_dual/vote_entropy_mean": float(self.stats.vote_entropy.mean()),
            "agpo_dual/dispersion_mean": float(self.stats.dispersion.mean()),
            "agpo_dual/probe_success": float(np.asarray(probe.rewards, dtype=np.float64).mean()),
            "agpo_dual/probe_tokens": float(self.probe_tokens),
        })
        return {"temperature": temperature}

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        if batch.entropy is None:
            raise BatchInputError("AGPO's clip needs the old policy's token entropies of the step's responses")
        uids = batch.uids.tolist()
        try:
            rows = np.array([self.prompts[u] for u in uids], dtype=np.int64)
        except KeyError as exc:
            raise BatchInputError(f"a response of prompt {exc.args[0]!r} has no probe statistics") from None
        order = list(self.prompts)
        h_pi = pooled_entropy(batch.entropy, batch.response_mask, batch.uids, order)
        present = np.unique(rows)
        stats = ProbeStats(*(getattr(self.stats, f)[present] for f in STAT_FIELDS))
        eps, ratio = self.state.clips(h_pi[present], stats, self.settings)
        per_prompt = np.zeros(len(order))
        per_prompt[present] = eps
        eps_mean, eps_std = _spread(eps)
        self.metrics.update({"agpo_dual/clip_eps_mean": eps_mean, "agpo_dual/clip_eps_std": eps_std,
                             "agpo_dual/entropy_mean": float(h_pi[present].mean()),
                             "agpo_dual/entropy_ratio_mean": float(np.mean(ratio))})
        # Every output of a trajectory is a row of its prompt: each row's own value is its trajectory's.
        return StepOutput(loss_columns={CLIP_COLUMN: per_prompt[rows]},
                          dump={"agpo_dual_temperature": self.temperature[rows], CLIP_COLUMN: per_prompt[rows]})

    def after_update(self, step: int, batch: StepBatch, host: Host) -> None:
        new = host.policy_log_probs()
        self.step_kls.append(step_kl(batch.old_log_probs, new, batch.response_mask, batch.uids))

    def end_step(self, step: int) -> dict[str, float]:
        if self.step_kls:
            kl = float(np.mean(self.step_kls))
            self.state.add_step_kl(kl, self.settings)
            self.metrics["agpo_dual/step_kl"] = kl
        self.metrics.update({"agpo_dual/kl_avg": self.state.kl_avg,
                             "agpo_dual/uncertainty_avg": self.state.uncertainty_avg,
                             "agpo_dual/entropy_ref": self.state.entropy_ref})
        return dict(self.metrics)
