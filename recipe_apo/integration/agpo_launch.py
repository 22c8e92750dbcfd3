"""``method=agpo_dual`` at launch: where its agent loop is registered, and what verl must run it with.

AGPO's per-prompt temperature needs the ``agpo_tempered`` agent loop (``recipe_apo.integration.tempered_loop``)
registered in verl's agent loop workers, which read ``rollout.agent.agent_loop_config_path``: ``route_agent_loops``
points an unset path at the recipe's ``agent_loops.yaml``; a file of your own must list the entry (the CPU
rehearsal's two-turn loops file does). ``check_agpo_launch`` refuses, in one line each, what cannot host the
controllers: a trainer other than the recipe's, verl's asynchronous modes (they submit a step's prompts ahead of
the weights it samples with and refill across updates, while the probe must finish before its prompts' training
generation), verl's group filter (its refills would probe and train outside the step's statistics), verl's
rollout-correction bypass mode (it skips the old policy's pass, whose token entropies the clip reads), and a rollout
temperature other than tau_base (the actor's log-probs divide the logits by it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.modes import ASYNC_MODES, is_recipe_trainer, verl_mode
from recipe_apo.methods.agpo_dual import AgpoConfigError, AgpoSettings
from recipe_apo.methods.agpo_loss import NAME as AGPO_LOSS
from recipe_apo.reward.vote_keys import VoteKeyError, load_vote_key

TEMPERED_LOOP = "agpo_tempered"
TEMPERATURE_KEY = "agpo_temperature"
INNER_KEY = "agpo_agent_name"
AGENT_LOOPS = str(Path(__file__).with_name("agent_loops.yaml"))
TEMPERED_TARGET = "recipe_apo.integration.tempered_loop.TemperedAgentLoop"


def uses_agpo(config: Any) -> bool:
    return str(config.actor_rollout_ref.actor.policy_loss.loss_mode) == AGPO_LOSS


def agpo_settings(config: Any) -> AgpoSettings:
    try:
        return AgpoSettings.from_algorithm_config(config.algorithm)
    except AgpoConfigError as exc:
        raise RecipeConfigError(str(exc)) from None


def route_agent_loops(config: Any) -> None:
    """An AGPO run without an agent loop file of its own gets the recipe's (which registers ``agpo_tempered``)."""
    if not uses_agpo(config):
        return
    agent = config.actor_rollout_ref.rollout.agent
    if agent.get("agent_loop_config_path") is None:
        with open_dict(config):
            agent.agent_loop_config_path = AGENT_LOOPS


def _lists_tempered_loop(path: str) -> bool:
    try:
        entries = OmegaConf.load(path)
    except Exception as exc:
        raise RecipeConfigError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path} cannot be read "
                                f"({type(exc).__name__}: {exc})") from None
    return any(isinstance(e, dict) or OmegaConf.is_dict(e) for e in entries) and any(
        e.get("name") == TEMPERED_LOOP and e.get("_target_") == TEMPERED_TARGET for e in entries)


def check_agpo_launch(config: Any) -> None:
    """Refuses, in one line, an AGPO run that verl's loop cannot host (the module docstring says which)."""
    if not uses_agpo(config):
        return
    settings = agpo_settings(config)
    try:  # a module:function that does not load is named now, not in a Ray worker
        load_vote_key(settings.vote_key)
    except VoteKeyError as exc:
        raise RecipeConfigError(str(exc)) from None
    mode = str(config.trainer.get("v1", {}).get("trainer_mode", "sync"))
    if not is_recipe_trainer(mode):
        raise RecipeConfigError(f"policy_loss.loss_mode={AGPO_LOSS} (method=agpo_dual) needs the recipe's trainer "
                                f"(trainer.v1.trainer_mode=sync; got {mode}): it probes each prompt and writes "
                                "each prompt's clip into the batch")
    if verl_mode(mode) in ASYNC_MODES:
        raise RecipeConfigError(
            f"method=agpo_dual with trainer.v1.trainer_mode={verl_mode(mode)}: AGPO probes a step's prompts and "
            "sets their temperatures before their training generation, but verl's asynchronous trainers generate "
            "prompts ahead of their step, across weight updates; use trainer.v1.trainer_mode=sync")
    filter_groups = config.algorithm.get("filter_groups", None) or {}
    if filter_groups.get("enable", False):
        raise RecipeConfigError("algorithm.filter_groups.enable=true with method=agpo_dual: verl's group filter "
                                "refills a step with prompts generated outside its probe; set it to false")
    correction = config.algorithm.get("rollout_correction", None) or {}
    if correction.get("bypass_mode", False):
        raise RecipeConfigError("algorithm.rollout_correction.bypass_mode=true with method=agpo_dual: AGPO's clip "
                                "reads the old policy's token entropy, which verl computes only when it recomputes "
                                "the old log-probs; set bypass_mode=false")
    temperature = config.actor_rollout_ref.rollout.temperature
    if temperature != settings.base_temperature:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.temperature={temperature} with algorithm.agpo.base_temperature="
            f"{settings.base_temperature}: method=agpo_dual needs them equal (tau_base is the probe's temperature "
            "and the one the actor's log-probs use); set algorithm.agpo.base_temperature instead")
    path = config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
    if path is None or not _lists_tempered_loop(str(path)):
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path} does not register the agent loop "
            f"{TEMPERED_LOOP} that method=agpo_dual samples through: add the entry of {AGENT_LOOPS} to it")
