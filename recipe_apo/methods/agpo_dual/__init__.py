"""AGPO with dual statistical feedback (arXiv 2605.20722; ``wandugu/paper_agpo``): ``method=agpo_dual``. A probe of G
samples per prompt sets the prompt's sampling temperature tau_t and its own PPO clip eps_p from the group's
statistics.

- ``controllers``: the probe's statistics (sigma_p, kappa, H_v), U and U_bar, tau_t, H_ref and eps_p, KL_bar;
- ``loss``: ``agpo_clip``, verl's vanilla clip with each row's eps_p;
- ``vote_keys``: the answer a response votes for in H_v;
- ``settings``: ``algorithm.agpo_dual``;
- ``launch``: what the launch refuses (verl's loop must let the probe finish before its prompts' training rollout);
- ``runtime``: the probe of each step's drawn prompts (through its host), each prompt's temperature, the clip
  column, the step KL after the update, ``agpo_dual/*`` metrics and ``agpo_dual_state.json``.
"""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.agpo_dual.settings import AgpoDualSettings
from recipe_apo.methods.base import Method, Metric, setting

LOSS = "agpo_clip"
# The loss column of each row's eps_p (``loss``), also in the rollout dump.
CLIP_COLUMN = "agpo_dual_clip_eps"


def uses_agpo_dual(config: Any) -> bool:
    """A run of ``config`` runs AGPO's controllers: its policy loss is ``agpo_clip``, which needs the clips."""
    return str(setting(config, "actor_rollout_ref.actor.policy_loss.loss_mode")) == LOSS


METHOD = Method(
    name="agpo_dual",
    title="AGPO (dual)",
    active=uses_agpo_dual,
    presets=("agpo_dual",),
    settings=AgpoDualSettings,
    prompt_columns=("temperature",),
    old_state_files=("agpo_state.json",),  # its name while it shared AGPO's: such a checkpoint still resumes
    order=4,
    metrics={
        "temperature_mean": Metric("tau_t, mean over the step's prompts", headline=True, trust=True),
        "temperature_std": Metric("tau_t, std over the step's prompts", trust=True),
        "uncertainty_mean": "U, mean over the step's prompts",
        "uncertainty_avg": "U_bar after the step",
        "vote_entropy_mean": "H_v of the probe's answers, mean over prompts",
        "dispersion_mean": "sigma_p of the probe's rewards, mean over prompts",
        "probe_success": "mean reward of the probe's responses",
        "probe_tokens": "response tokens the probe generated (scored, then dropped)",
        "clip_eps_mean": Metric("eps_p, mean over the step's prompts", headline=True, trust=True),
        "clip_eps_std": Metric("eps_p, std over the step's prompts", trust=True),
        "entropy_mean": "H_pi, the old policy's token entropy, mean over prompts",
        "entropy_ratio_mean": "H_pi / H_ref, mean over prompts",
        "entropy_ref": "H_ref after the step",
        "step_kl": "step_KL of the step's updates",
        "kl_avg": Metric("KL_bar after the step", headline=True, trust=True, final=True),
    },
)

# Its parts declare themselves into METHOD where they are defined (``@METHOD.loss(...)``, ...).
from recipe_apo.methods.agpo_dual import launch, loss, runtime  # noqa: E402, F401
