"""AGPO with dual statistical feedback in the testbed (``method=agpo_dual``; the algorithm and its symbols:
``recipe_apo.methods.agpo_dual``), one ``AgpoState`` per run, fresh at its start. A round, as the source's step:

1. ``probe``: ``probe_samples`` (G) responses per prompt at ``base_temperature``, from the policy that samples the
   round, scored by the task; their rewards and answer keys (the task's ``vote_key``) give sigma_p, kappa, H_v
   (``ProbeStats``), U, and tau_t per prompt (``AgpoState.temperatures``, moving U_bar prompt by prompt). The
   probe's responses are then dropped: they train nothing.
2. The round's training responses of each prompt are drawn at its tau_t (``rollout``'s per-prompt temperature);
   their old log-probs and entropies are of the unscaled policy, as the source takes them.
3. ``clips``: H_pi per prompt, the old policy's token entropy pooled over the prompt's training responses
   (``pooled_entropy``), gives eps_p (``AgpoState.clips``, moving H_ref); each response gets its prompt's eps,
   which ``update.ppo_update`` hands to the loss ``agpo_clip`` micro-batch by micro-batch.
4. ``after_update``: step_KL of the round's training responses, old log-probs against the updated policy's
   (``step_kl``), into KL_bar (``AgpoState.add_step_kl``).

The probe has a random stream of its own, so the training samples' stream is the one every method of a seed
reads. Everything per response is a tensor operation; the controllers' recurrences run over the round's prompts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from recipe_apo.methods.agpo_dual import AgpoSettings, AgpoState, ProbeStats, pooled_entropy, step_kl
from recipe_apo.testbed.policy import TokenPolicy
from recipe_apo.testbed.rollout import rollout
from recipe_apo.testbed.task import Task

# The loss that runs AGPO's controllers: method=agpo_dual's (conf/method/agpo_dual.yaml).
LOSS = "agpo_clip"


def is_agpo(cfg: DictConfig) -> bool:
    """Whether a run's config runs AGPO: its policy loss is ``agpo_clip``, which needs the per-prompt clips."""
    return str(cfg.actor_rollout_ref.actor.policy_loss.loss_mode) == LOSS


class AgpoRun:
    """AGPO's controllers over one (seed, method) run: the settings, the state (U_bar, H_ref, KL_bar), the
    probe's random stream, and what the current round computed (``metrics``)."""

    def __init__(self, cfg: DictConfig, probe_generator: torch.Generator) -> None:
        self.settings = AgpoSettings.from_algorithm_config(cfg.algorithm)
        self.state = AgpoState()
        self.generator = probe_generator
        self.stats: ProbeStats | None = None
        self.metrics: dict[str, float] = {}

    def probe(self, sampler: TokenPolicy, task: Task, prompts: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """tau_t per prompt [P] from a probe of G responses per prompt at ``base_temperature``."""
        settings, n_prompts = self.settings, prompts.shape[0]
        base = torch.full((n_prompts,), float(settings.base_temperature))
        probe = rollout(sampler, task, prompts, k, settings.probe_samples, self.generator, base)
        rewards = probe["reward"].double().view(n_prompts, settings.probe_samples).numpy()
        keys = task.vote_key(probe["prompts"], probe["k"], probe["responses"])
        self.stats = ProbeStats.of(rewards, keys.reshape(n_prompts, settings.probe_samples).tolist(),
                                   settings.dispersion)
        uncertainty = self.stats.uncertainty(settings)
        tau, _ = self.state.temperatures(uncertainty, settings)
        self.metrics = {
            "agpo_tau_mean": float(tau.mean()),
            "agpo_tau_std": float(tau.std()),
            "agpo_u_mean": float(uncertainty.mean()),
            "agpo_u_bar": self.state.uncertainty_avg,
            "agpo_vote_entropy_mean": float(self.stats.vote_entropy.mean()),
            "agpo_sigma_mean": float(self.stats.dispersion.mean()),
            "probe_tokens": float(probe["response_mask"].sum()),
            "probe_success": float(probe["reward"].mean()),
        }
        return torch.from_numpy(tau).to(torch.float32)

    def clips(self, batch: dict[str, Any], entropy: torch.Tensor, group: int) -> torch.Tensor:
        """eps of each training response [n] (its prompt's eps_p), from the old policy's token ``entropy``."""
        order = batch["uid"][::group]
        h_pi = pooled_entropy(entropy, batch["response_mask"], batch["uid"], list(order))
        eps, ratio = self.state.clips(h_pi, self.stats, self.settings)
        self.metrics.update({
            "agpo_eps_mean": float(eps.mean()),
            "agpo_eps_std": float(eps.std()),
            "agpo_entropy_mean": float(h_pi.mean()),
            "agpo_entropy_ratio_mean": float(ratio.mean()),
        })
        return torch.from_numpy(eps).to(torch.float32).repeat_interleave(group)

    def after_update(self, policy: TokenPolicy, batch: dict[str, Any], old_log_prob: torch.Tensor) -> None:
        """step_KL of the round (old log-probs against the updated policy's) into KL_bar."""
        with torch.no_grad():
            new_log_prob = policy.log_probs(batch["prompts"], batch["responses"])
        kl = step_kl(old_log_prob, new_log_prob, batch["response_mask"], np.asarray(batch["uid"]))
        self.state.add_step_kl(kl, self.settings)
        self.metrics.update({"agpo_step_kl": kl, "agpo_kl_bar": self.state.kl_avg})
