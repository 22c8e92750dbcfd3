"""The recipe's Ray task runner: verl's V1 ``TaskRunner`` with the recipe's trainer and a start-up check."""

from __future__ import annotations

import ray
from verl.trainer.main_ppo import TaskRunnerV1


class _ApoTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def run(self, config):
        import recipe_apo.trainer  # noqa: F401  (registers trainer_mode=apo_sync in this process)
        from recipe_apo.cluster import check_apo_on_every_node

        if "apo" in (str(config.algorithm.adv_estimator), str(config.actor_rollout_ref.actor.policy_loss.loss_mode)):
            check_apo_on_every_node()
        return super().run(config)


ApoTaskRunner = ray.remote(_ApoTaskRunner)
