"""Per-row loss columns from the batch to the policy loss, in the actor's workers.

verl's ``ppo_loss`` hands a registered policy loss no batch column; a method whose loss reads some
(``Method.loss_columns``: AGPO's ``agpo_clip_eps``) gets them written into the batch by the recipe's trainer, and
``ColumnLoss`` is verl's ``ppo_loss`` with those columns of the micro-batch handed to the loss while it runs
(``recipe_apo.methods.loss_inputs``). The trainer installs it in every actor worker with verl's own ``set_loss_fn``
(a registered worker method), so the rest of the loss (KL, entropy, aggregation, metrics) is verl's, unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from recipe_apo.methods.errors import BatchInputError
from recipe_apo.methods.loss_inputs import handed_columns


class ColumnLoss:
    """``ppo_loss(config, ...)`` with the micro-batch's ``columns`` handed to the policy loss."""

    def __init__(self, config: Any, columns: Sequence[str]) -> None:
        self.config, self.columns = config, tuple(columns)

    def __call__(self, model_output: Any, data: Any, dp_group: Any = None):
        from verl.workers.utils.losses import ppo_loss

        handed = {}
        for name in self.columns:
            if name not in data.keys():
                raise BatchInputError(f"the actor's micro-batch has no {name} column: the recipe's trainer writes it "
                                      "before the update")
            value = data[name]
            values = value.values() if getattr(value, "is_nested", False) else torch.as_tensor(value)
            handed[name] = values.reshape(-1)
        with handed_columns(handed):
            return ppo_loss(self.config, model_output, data, dp_group)


def actor_loss_config(config: Any) -> Any:
    """The actor config verl's worker builds for ``ppo_loss`` (``omega_conf_to_dataclass`` of
    ``actor_rollout_ref.actor``), built on the driver."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)
