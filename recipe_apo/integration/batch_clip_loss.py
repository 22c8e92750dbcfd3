"""The per-prompt clip from the batch to the policy loss, in the actor's workers (``method=agpo_dual``).

verl's ``ppo_loss`` hands a registered policy loss no batch column; AGPO's loss (``agpo_clip``,
``recipe_apo.methods.agpo_loss``) needs each row's clip eps, which the recipe's trainer writes into the batch as
``agpo_clip_eps`` (``hooks/agpo.py``). ``BatchClipLoss`` is verl's ``ppo_loss`` with that column of the
micro-batch handed to the loss while it runs; the trainer installs it in every actor worker with verl's own
``set_loss_fn`` (a registered worker method), so the rest of the loss (KL, entropy, aggregation, metrics) is
verl's, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from recipe_apo.methods.agpo_loss import clip_handed
from recipe_apo.methods.errors import BatchInputError

COLUMN = "agpo_clip_eps"


class BatchClipLoss:
    """``ppo_loss(config, ...)`` with the micro-batch's ``agpo_clip_eps`` handed to the policy loss."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def __call__(self, model_output: Any, data: Any, dp_group: Any = None):
        from verl.workers.utils.losses import ppo_loss

        if COLUMN not in data.keys():
            raise BatchInputError(f"the actor's micro-batch has no {COLUMN} column: method=agpo_dual's trainer "
                                  "writes it before the update")
        eps = data[COLUMN]
        eps = (eps.values() if getattr(eps, "is_nested", False) else torch.as_tensor(eps)).reshape(-1)
        with clip_handed(eps):
            return ppo_loss(self.config, model_output, data, dp_group)


def actor_loss_config(config: Any) -> Any:
    """The actor config verl's worker builds for ``ppo_loss`` (``omega_conf_to_dataclass`` of
    ``actor_rollout_ref.actor``), built on the driver."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)
