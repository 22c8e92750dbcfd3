"""What the launch refuses or warns about in an APO run, before Ray starts (``recipe_apo.integration.validation``
runs every method's checks, each on a ``Launch``; a refusal is one ``MethodConfigError`` line naming the key)."""

from __future__ import annotations

from typing import Any, Optional

from recipe_apo.methods.apo import LOSS, METHOD, ONE_SIDED_LOSS, uses_apo
from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.base import Launch
from recipe_apo.methods.checks import TEMPERATURE_BOUNDS, check_number
from recipe_apo.methods.errors import MethodConfigError

# How a refusal names the trainers that run the recipe's own driver code.
RECIPE_TRAINERS = "trainer.v1.trainer_mode=sync, colocate_async or separate_async"
# verl 0.9.1's own agent loops, each returning one output per trajectory (single_turn_agent_loop.py,
# tool_agent_loop.py); any other loop may return several (recipe_apo.integration.multi_output).
SINGLE_OUTPUT_AGENT_LOOPS = ("single_turn_agent", "tool_agent")


def _mode(launch: Launch) -> str:
    return str(launch.config.trainer.get("v1", {}).get("trainer_mode", "sync"))


@METHOD.launch_check
def check_rewards_and_scope(launch: Launch) -> None:
    """Refuses APO settings whose inputs the run does not provide: KL-penalised rewards for a success rule that
    needs rewards in [0, 1], data-source anchors without the recipe's trainer (only it hands data sources over)."""
    config = launch.config
    if not uses_apo(config):
        return
    settings = ApoSettings.from_algorithm_config(config.algorithm)
    if config.algorithm.get("use_kl_in_reward", False) and settings.success != "threshold":
        # The summed token rewards then carry -beta * KL and leave [0, 1]: the first step would stop.
        raise MethodConfigError(
            f"algorithm.use_kl_in_reward=true with algorithm.apo.success={settings.success}: KL-penalised "
            "rewards leave the success range; use algorithm.apo.success=threshold or the KL loss "
            "(actor_rollout_ref.actor.use_kl_loss=true)"
        )
    if settings.anchor_scope == "data_source" and not launch.recipe_trainer:
        raise MethodConfigError(
            f"algorithm.apo.anchor_scope=data_source needs the recipe's trainer ({RECIPE_TRAINERS}; got "
            f"{_mode(launch)}): only the recipe's trainer hands data sources to the estimator"
        )


@METHOD.launch_check
def check_std_normalisation(launch: Launch) -> None:
    """Refuses ``norm_adv_by_std_in_grpo=true`` with the apo estimator, which never reads it."""
    config = launch.config
    if uses_apo(config) and bool(config.algorithm.get("norm_adv_by_std_in_grpo", True)):
        raise MethodConfigError(
            "algorithm.norm_adv_by_std_in_grpo=true is not read by algorithm.adv_estimator=apo (APO never divides "
            "by the group's std): set it to false, or use adv_estimator=grpo for std-normalized advantages"
        )


@METHOD.launch_check
def check_temperatures(launch: Launch) -> None:
    """Refuses APO's losses (the gate and its one-sided form) with temperatures (tau_pos, tau_neg) outside
    ``TEMPERATURE_BOUNDS``: the gate divides by them, and a tiny one makes the loss NaN or infinite."""
    actor = launch.config.actor_rollout_ref.actor
    if str(actor.policy_loss.loss_mode) not in (LOSS, ONE_SIDED_LOSS):
        return
    low, high = TEMPERATURE_BOUNDS
    for key in ("tau_pos", "tau_neg"):
        check_number(f"actor_rollout_ref.actor.{key}", actor.get(key), MethodConfigError, low=low, high=high)


@METHOD.launch_warning
def warn_multi_output_loops(launch: Launch) -> Optional[str]:
    """APO in verl's trainer with an agent loop that may return several outputs per trajectory: those weigh more."""
    from omegaconf import OmegaConf  # on use: importing a method's declaration stays light

    config: Any = launch.config
    agent = OmegaConf.select(config, "actor_rollout_ref.rollout.agent", default=None) or {}
    loop = agent.get("default_agent_loop", None) or "single_turn_agent"
    if not uses_apo(config) or launch.recipe_trainer or (
            loop in SINGLE_OUTPUT_AGENT_LOOPS and not agent.get("agent_loop_config_path", None)):
        return None
    return (
        f"algorithm.adv_estimator=apo with trainer.v1.trainer_mode={_mode(launch)} and agent loop {loop}: if a loop "
        "returns several outputs per trajectory, verl's trainer hands apo every output as a response of its group "
        "(its final-output rule covers grpo only), so trajectories with more outputs weigh more in the group and "
        f"the anchor; the recipe's trainer ({RECIPE_TRAINERS}) applies the rule to apo"
    )
