"""What the launch refuses of an AGPO run, before Ray starts (each check takes a ``Launch``; a refusal is one
``MethodConfigError`` line naming the key)."""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.agpo import METHOD, uses_agpo
from recipe_apo.methods.base import Launch
from recipe_apo.methods.errors import MethodConfigError

# What verl 0.9.1's group filter may classify an AGPO group by: "reward", the canonical pre-KL score (rm_scores), or
# the authors' "acc", which verl's reward loop records for a scorer that returns a number (the recipe's). Any other
# name is a key of the scorer's reward_extra_info that verl reads only after Ray, the model load and the first
# generation (trainer_base._resolve_filter_groups_metric accepts any non-empty name; the replay buffer then raises
# on a missing key, or on a value float() refuses), and that AGPO's filter on correct/incorrect groups does not use.
FILTER_METRICS = ("reward", "acc")


@METHOD.launch_check
def check_rewards(launch: Launch) -> None:
    """Refuses what makes AGPO's reading of the rewards wrong: a KL penalty in them (no reward is then exactly 1,
    so no length bonus and no +-1 rule), the zero-variance rescale (it takes a group whose rewards are all equal
    for one without a signal, where AGPO gives it +-1), and a group filter on another metric than the rewards'
    (``FILTER_METRICS``)."""
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
    filter_groups = algorithm.get("filter_groups", None) or {}
    if filter_groups.get("enable", False):
        metric = filter_groups.get("metric", None)
        if not isinstance(metric, str) or metric not in FILTER_METRICS:
            raise MethodConfigError(
                f"algorithm.filter_groups.metric={metric} with algorithm.adv_estimator=agpo: the group filter must "
                "classify AGPO's groups by their rewards, reward (verl's pre-KL score) or acc (the authors'; the same "
                "for a scorer that returns a number); verl reads any other name from the scorer's reward_extra_info "
                "only after Ray and the first generation"
            )
