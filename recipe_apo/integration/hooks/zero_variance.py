"""AGPO's zero-variance denominator (``algorithm.zero_variance=exclude``, any estimator): the advantages verl
just wrote, rescaled so that groups whose rewards are all equal leave the loss's denominator
(``recipe_apo.methods.zero_variance`` says how, and when it is exact). With a multi-output agent loop a group is
dead when its trajectories' final outputs all scored alike, and every output row of its trajectories leaves the
denominator (``recipe_apo.integration.multi_output``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from recipe_apo.integration import batch_fields
from recipe_apo.integration.hooks.base import TrainerHook
from recipe_apo.integration.multi_output import Sessions
from recipe_apo.methods.zero_variance import check_mode, exclude_zero_variance


class ZeroVarianceHook(TrainerHook):
    @classmethod
    def wanted(cls, config: Any) -> bool:
        return str(config.algorithm.get("zero_variance", "keep")) == "exclude"

    def __init__(self, trainer: Any, config: Any) -> None:
        super().__init__(trainer, config)
        # The launch checks ran this already; a trainer started another way (plain verl with this trainer's
        # mode) must not rescale on rewards the estimator does not centre either.
        algorithm = self.config.algorithm
        check_mode(algorithm.get("zero_variance"), str(self.config.actor_rollout_ref.actor.loss_agg_mode),
                   algorithm.get("use_kl_in_reward", False))

    def after_advantage(self, batch: Any, metrics: dict, sessions: Sessions) -> None:
        data = batch_fields.read(batch, ["uid", "response_mask", "rm_scores", "advantages"])
        nested_mask = data["response_mask"]
        scaled, zv_metrics = exclude_zero_variance(
            data["advantages"].to_padded_tensor(padding=0.0), data["rm_scores"].to_padded_tensor(padding=0.0),
            nested_mask.to_padded_tensor(padding=0), np.asarray(list(data["uid"]), dtype=object),
            str(self.config.actor_rollout_ref.actor.loss_agg_mode),
            None if sessions.single_output else sessions.is_final,
        )
        batch_fields.write(batch, {"advantages": scaled}, nested_mask)
        metrics.update(zv_metrics)
