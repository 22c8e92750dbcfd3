"""The recipe's Ray task runner: verl's V1 ``TaskRunner`` with the recipe's trainer and, for a run that uses
any estimator or loss the plugin registers, a start-up check of every Ray node."""

from __future__ import annotations

import ray
from verl.trainer.main_ppo import TaskRunnerV1


class _RecipeTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def run(self, config):
        import recipe_apo.integration.trainer  # noqa: F401  (registers the recipe's trainer modes here)
        from recipe_apo.integration.cluster import check_recipe_on_every_node
        from recipe_apo.plugin import ESTIMATORS, LOSSES

        if (str(config.algorithm.adv_estimator) in ESTIMATORS
                or str(config.actor_rollout_ref.actor.policy_loss.loss_mode) in LOSSES):
            check_recipe_on_every_node()
        return super().run(config)


RecipeTaskRunner = ray.remote(_RecipeTaskRunner)
