"""The zero-variance denominator over a run: after every other method's advantages (it comes last in the catalog),
the live groups' advantages times the step's B / B_live (``rescale``), ``zero_variance/*`` metrics.

With a multi-output agent loop a group is dead when its trajectories' final outputs all scored alike, and every
output row of its trajectories leaves the denominator (``rescale``'s docstring).

In the CPU testbed, whose update sets each mini-batch's denominators itself, ``loss_denominators`` also gives the
reference ``algorithm.zero_variance=exact`` (each mini-batch's own live responses and tokens) and, under
``exclude``, how far the step-level scale is off for each mini-batch (``zero_variance/ratio_dev_*``). verl's actor
fixes its denominators per mini-batch and calls nothing of this.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.methods.base import MethodRuntime, StepBatch, StepOutput
from recipe_apo.methods.checks import effective_agg_mode
from recipe_apo.methods.group_stats import live_rows
from recipe_apo.methods.zero_variance import METHOD
from recipe_apo.methods.zero_variance.rescale import check_mode, denominator_ratio, exclude_zero_variance


@METHOD.runtime
class ZeroVarianceRuntime(MethodRuntime):
    needs = frozenset({"advantages"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
        self.mode = str(algorithm.get("zero_variance", "keep"))
        self.agg_mode = effective_agg_mode(actor.policy_loss.loss_mode, actor.loss_agg_mode)
        # The launch checks ran this already; a trainer started another way must not rescale on rewards the
        # estimator does not centre either. ``exact`` has the same need of a denominator.
        check_mode("exclude", self.agg_mode, algorithm.get("use_kl_in_reward", False))
        self.begin_step(0)

    def begin_step(self, step: int) -> None:
        self.live: Optional[np.ndarray] = None
        self.tokens: Optional[np.ndarray] = None
        self.deviations: list[float] = []

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        outcome_rows = None if batch.trajectories.single_output else batch.trajectories.is_final
        self.tokens = batch.response_mask.sum(dim=-1).cpu().numpy().astype(np.float64)
        scores = batch.token_level_scores.detach().sum(dim=-1).double().cpu().numpy()
        self.live = live_rows(scores, self.tokens > 0, batch.uids, outcome_rows)
        if self.mode == "exact":
            return StepOutput()
        scaled, metrics = exclude_zero_variance(batch.advantages, batch.token_level_scores, batch.response_mask,
                                                batch.uids, self.agg_mode, outcome_rows)
        return StepOutput(advantages=scaled, metrics=metrics)

    def loss_denominators(self, rows: torch.Tensor, mask: torch.Tensor) -> Optional[dict[str, Any]]:
        """The testbed's mini-batch of ``rows``: under ``exact`` its own live responses and tokens as its loss's
        denominators (none when it has no live response: its loss is 0 whatever they are); under ``exclude``
        its ``denominator_ratio`` (each |ratio - 1| kept for the step's metrics)."""
        if self.live is None:
            return None
        if self.mode == "exact":
            live = rows[torch.from_numpy(self.live)[rows]]
            if len(live):
                return {"responses": len(live), "tokens": int(mask[live].sum())}
            return None
        ratio = denominator_ratio(self.live, rows.numpy(), self.tokens, self.agg_mode)
        self.deviations.append(abs(ratio - 1.0))
        return {"denominator_ratio": ratio}

    def end_step(self, step: int) -> dict[str, float]:
        if not self.deviations:
            return {}
        return {"zero_variance/ratio_dev_mean": sum(self.deviations) / len(self.deviations),
                "zero_variance/ratio_dev_max": max(self.deviations)}
