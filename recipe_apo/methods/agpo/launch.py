"""What the launch refuses of an AGPO run, before Ray starts (each check takes a ``Launch``; a refusal is one
``MethodConfigError`` line naming the key)."""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.agpo import uses_agpo
from recipe_apo.methods.base import Launch
from recipe_apo.methods.errors import MethodConfigError


def check_rewards(launch: Launch) -> None:
    """Refuses what makes AGPO's reading of the rewards wrong: a KL penalty in them (no reward is then exactly 1,
    so no length bonus and no +-1 rule), and the zero-variance rescale (it takes a group whose rewards are all equal
    for one without a signal, where AGPO gives it +-1)."""
    if uses_agpo(launch.config):
        check_algorithm(launch.config.algorithm)


def check_algorithm(algorithm: Any) -> None:
    """``check_rewards`` on verl's ``algorithm`` node alone (the runtime asks it too: the testbed runs no launch)."""
    if algorithm.get("use_kl_in_reward", False):
        raise MethodConfigError(
            "algorithm.use_kl_in_reward=true with algorithm.adv_estimator=agpo: AGPO reads a reward of exactly 1 as "
            "correct (its length bonus and its +1 rule); a KL penalty moves every reward off it. Set "
            "use_kl_in_reward=false (a KL term belongs in actor_rollout_ref.actor.use_kl_loss)"
        )
    if algorithm.get("zero_variance", "keep") != "keep":
        raise MethodConfigError(
            f"algorithm.zero_variance={algorithm.get('zero_variance')} with algorithm.adv_estimator=agpo: AGPO gives "
            "a group whose rewards are all 1 or all 0 the advantage +1 or -1, where the zero-variance rescale takes "
            "it for a group without a signal; set algorithm.zero_variance=keep"
        )
