"""AGPO over a run: the step's shaped training rewards and the authors' +-1 rule, measured from the batch the
estimator saw (``agpo/*`` metrics), and each row's training reward in the rollout dump (``agpo_shaped_reward``,
``agpo_saturated``), so that a dump holds what the advantages were computed from. AGPO keeps no state."""

from __future__ import annotations

from typing import Any

import numpy as np

from recipe_apo.methods.agpo.estimator import compute_agpo_advantage
from recipe_apo.methods.agpo.launch import check_algorithm
from recipe_apo.methods.agpo.settings import AgpoSettings
from recipe_apo.methods.base import MethodRuntime, StepBatch, StepOutput
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.settings import read_flag


class AgpoRuntime(MethodRuntime):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        check_algorithm(config.algorithm)
        self.settings = AgpoSettings.from_algorithm_config(config.algorithm)
        self.norm = read_flag(config.algorithm, "norm_adv_by_std_in_grpo", True, MethodConfigError)

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        # The rows the estimator saw: with a multi-output agent loop, each trajectory's final output.
        trajectories = batch.trajectories
        mask = trajectories.finals(batch.response_mask)
        _, rows = compute_agpo_advantage(trajectories.finals(batch.token_level_scores), mask,
                                         trajectories.finals(batch.uids), self.norm, self.settings)
        valid = mask.sum(dim=-1).cpu().numpy() > 0
        count = max(int(valid.sum()), 1)
        metrics = {
            self.method.metric("shaped_reward_mean"): float(rows["shaped"][valid].sum() / count),
            self.method.metric("bonus_share"): float(rows["bonused"][valid].sum() / count),
            self.method.metric("saturated_share"): float((rows["saturated"][valid] != 0).sum() / count),
        }
        dump = {"agpo_shaped_reward": trajectories.broadcast(rows["shaped"]),
                "agpo_saturated": trajectories.broadcast(rows["saturated"].astype(np.float64))}
        return StepOutput(metrics=metrics, dump=dump)
