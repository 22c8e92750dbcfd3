"""AGPO over a run: the step's shaped training rewards and the authors' +-1 rule, as the estimator computed them
(``StepBatch.estimator_results``), as ``agpo/*`` metrics, and each row's training reward in the rollout dump
(``agpo_shaped_reward``, ``agpo_saturated``), so that a dump holds what the advantages were computed from. The
training reward is on ``algorithm.agpo.wrong_reward``'s scale: -1/+1 by default (a wrong answer -1, a right one 1
to 1 + b), beside the dump's 0/1 ``score``. AGPO keeps no state."""

from __future__ import annotations

from typing import Any

import numpy as np

from recipe_apo.methods.agpo import METHOD
from recipe_apo.methods.agpo.launch import check_algorithm
from recipe_apo.methods.base import MethodRuntime, StepBatch, StepOutput


@METHOD.runtime
class AgpoRuntime(MethodRuntime):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        check_algorithm(config.algorithm)

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        result = batch.estimator_results.get(self.method.name)
        if result is None:  # the step computed no agpo advantages
            return StepOutput()
        rows = result.per_response  # the estimator's rows: with a multi-output agent loop, the final outputs
        valid = rows["valid"]
        count = max(int(valid.sum()), 1)
        metrics = {
            self.method.metric("shaped_reward_mean"): float(rows["shaped"][valid].sum() / count),
            self.method.metric("bonus_share"): float(rows["bonused"][valid].sum() / count),
            self.method.metric("saturated_share"): float((rows["saturated"][valid] != 0).sum() / count),
        }
        dump = {"agpo_shaped_reward": batch.trajectories.broadcast(rows["shaped"]),
                "agpo_saturated": batch.trajectories.broadcast(rows["saturated"].astype(np.float64))}
        return StepOutput(metrics=metrics, dump=dump)
