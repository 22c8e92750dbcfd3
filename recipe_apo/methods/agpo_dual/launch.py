"""What the launch refuses in an AGPO (dual feedback) run: what cannot host its controllers in verl's loop.

A trainer other than the recipe's; verl's asynchronous modes (they submit a step's prompts ahead of the weights it
samples with and refill across updates, while the probe must finish before its prompts' training generation);
verl's group filter (its refills would probe and train outside the step's statistics); verl's rollout-correction
bypass mode (it skips the old policy's pass, whose token entropies the clip reads); a rollout temperature other than
tau_base (the actor's log-probs use it); a ``vote_key`` that does not load, or that names a function of processes or
files (``vote_keys.refused_because``). A dry run (``dry_run=true``) checks the ``vote_key``'s name and finds its module
without importing or calling it: it runs nothing a setting names. The per-prompt temperature's agent loop is the verl
integration's to check (any method that samples prompts at their own settings needs it).
"""

from __future__ import annotations

from typing import Any

from recipe_apo.methods import catalog
from recipe_apo.methods.agpo_dual import LOSS, METHOD, uses_agpo_dual
from recipe_apo.methods.agpo_dual.settings import AgpoDualSettings
from recipe_apo.methods.agpo_dual.vote_keys import VoteKeyError, check_vote_key_name, load_vote_key
from recipe_apo.methods.base import Launch, MethodRuntime
from recipe_apo.methods.errors import MethodConfigError


@METHOD.launch_check
def check_agpo_dual_launch(launch: Launch) -> None:
    """Refuses, in one line, an AGPO run that verl's loop cannot host (the module docstring says which)."""
    config = launch.config
    if not uses_agpo_dual(config):
        return
    settings = AgpoDualSettings.from_algorithm_config(config.algorithm)
    try:  # a module:function that does not load is named now, not in a Ray worker
        if config.get("dry_run", False) is True:
            check_vote_key_name(settings.vote_key)
        else:
            load_vote_key(settings.vote_key)
    except VoteKeyError as exc:
        raise MethodConfigError(str(exc)) from None
    mode = str(config.trainer.get("v1", {}).get("trainer_mode", "sync"))
    if not launch.recipe_trainer:
        raise MethodConfigError(f"policy_loss.loss_mode={LOSS} (method=agpo_dual) needs the recipe's trainer "
                                f"(trainer.v1.trainer_mode=sync; got {mode}): it probes each prompt and writes "
                                "each prompt's clip into the batch")
    if launch.asynchronous:
        raise MethodConfigError(
            f"method=agpo_dual with trainer.v1.trainer_mode={launch.verl_mode}: AGPO probes a step's prompts and "
            "sets their temperatures before their training generation, but verl's asynchronous trainers generate "
            "prompts ahead of their step, across weight updates; use trainer.v1.trainer_mode=sync")
    filter_groups = config.algorithm.get("filter_groups", None) or {}
    if filter_groups.get("enable", False):
        raise MethodConfigError("algorithm.filter_groups.enable=true with method=agpo_dual: verl's group filter "
                                "refills a step with prompts generated outside its probe; set it to false")
    for other in catalog.active(config):
        runtime = other.parts.runtime
        if other.name != "agpo_dual" and runtime is not None and \
                runtime.replace_prompts is not MethodRuntime.replace_prompts:
            raise MethodConfigError(
                f"method=agpo_dual with {other.title} (algorithm.adv_estimator={config.algorithm.adv_estimator}): "
                f"{other.title} may train a step on prompts of its own, which AGPO has not probed; run one of them")
    correction = config.algorithm.get("rollout_correction", None) or {}
    if correction.get("bypass_mode", False):
        raise MethodConfigError("algorithm.rollout_correction.bypass_mode=true with method=agpo_dual: AGPO's clip "
                                "reads the old policy's token entropy, which verl computes only when it recomputes "
                                "the old log-probs; set bypass_mode=false")
    check_temperature(config, settings)


def check_temperature(config: Any, settings: AgpoDualSettings) -> None:
    """The rollout's temperature is tau_base: the probe's, and the one the actor's log-probs use (both adapters)."""
    temperature = config.actor_rollout_ref.rollout.get("temperature")
    if isinstance(temperature, str) or temperature != settings.base_temperature:
        shown = repr(temperature) if isinstance(temperature, str) else temperature  # '1.0' is not 1.0
        raise MethodConfigError(
            f"actor_rollout_ref.rollout.temperature={shown} with algorithm.agpo_dual.base_temperature="
            f"{settings.base_temperature}: method=agpo_dual needs them equal (tau_base is the probe's temperature "
            "and the one the actor's log-probs use); set algorithm.agpo_dual.base_temperature instead")
