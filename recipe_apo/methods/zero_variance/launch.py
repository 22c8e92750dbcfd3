"""What the launch refuses of ``algorithm.zero_variance``: the testbed's ``exact`` (a per-mini-batch denominator
verl's actor does not expose), a mode that has no denominator to exclude from or KL-penalised rewards
(``rescale.check_mode``), and ``exclude`` outside the recipe's trainer (only it rescales the advantages)."""

from __future__ import annotations

from recipe_apo.methods.base import Launch
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.zero_variance import METHOD
from recipe_apo.methods.zero_variance.rescale import check_mode

RECIPE_TRAINERS = "trainer.v1.trainer_mode=sync, colocate_async or separate_async"


@METHOD.launch_check
def check_zero_variance(launch: Launch) -> None:
    algorithm = launch.config.algorithm
    zero_variance = algorithm.get("zero_variance", "keep")
    if zero_variance == "exact":
        if launch.testbed:  # the testbed's own reference: its runtime checks what exact needs
            return
        raise MethodConfigError(
            "algorithm.zero_variance=exact is the testbed's reference (a per-mini-batch denominator that verl's "
            "actor does not expose): use algorithm.zero_variance=exclude"
        )
    check_mode(zero_variance, str(launch.config.actor_rollout_ref.actor.loss_agg_mode),
               algorithm.get("use_kl_in_reward", False))
    if zero_variance == "exclude" and not launch.recipe_trainer:
        mode = launch.config.trainer.get("v1", {}).get("trainer_mode", "sync")
        raise MethodConfigError(
            f"algorithm.zero_variance=exclude needs the recipe's trainer ({RECIPE_TRAINERS}; got {mode}): only the "
            "recipe's trainer rescales the advantages"
        )
