"""AGPO's per-prompt clip as a verl policy loss: ``policy_loss.loss_mode=agpo_clip`` (``method=agpo_dual``).

AGPO (``recipe_apo.methods.agpo_dual.controllers``) clips each prompt's ratios to [1 - eps_p, 1 + eps_p] with an
eps_p of its own. verl's policy losses get one clip for the whole batch (``clip_ratio_low``/``clip_ratio_high``) and
no batch columns, so the runtime writes each row's eps as the loss column ``agpo_dual_clip_eps``, the adapters hand
the micro-batch's rows over while verl's ``ppo_loss`` runs (``recipe_apo.methods.loss_inputs``), and this loss calls
verl's own ``vanilla`` loss with those per-row bounds: the loss, its dual clip
(``clip_ratio_c``), its aggregation and its metrics are verl's. With one eps for every row it *is* verl's
``vanilla`` at that clip (tested). Extra metric: ``actor/agpo_dual_clip_eps_mean`` (``CLIP_METRIC``), the mean eps
over the micro-batch's valid tokens.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from recipe_apo.methods.agpo_dual import CLIP_COLUMN, LOSS, METHOD
from recipe_apo.methods.errors import BatchInputError, MethodConfigError
from recipe_apo.methods.loss_inputs import handed_column

NAME = LOSS
CLIP_METRIC = "actor/agpo_dual_clip_eps_mean"


class _PerRowClip:
    """The actor config as verl's vanilla loss reads it, with the clip bounds per row: (batch, 1) tensors
    broadcast against its (batch, length) ratios."""

    def __init__(self, config: Any, eps: torch.Tensor) -> None:
        self._config, self.clip_ratio = config, eps
        self.clip_ratio_low = self.clip_ratio_high = eps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default) if key.startswith("clip_ratio") else self._config.get(key, default)


def check_clip(eps: torch.Tensor, rows: int) -> torch.Tensor:
    """``eps`` as a (rows, 1) float tensor; a clip outside (0, 1) or of another length is refused."""
    eps = torch.as_tensor(eps).reshape(-1)
    if eps.numel() != rows:
        raise BatchInputError(f"{CLIP_COLUMN}: {eps.numel()} values for a micro-batch of {rows} rows")
    bad = ~((eps > 0) & (eps < 1))
    if bad.any():
        row = int(torch.nonzero(bad)[0])
        raise BatchInputError(f"{CLIP_COLUMN}: row {row} has eps {float(eps[row])!r}; each must lie in (0, 1)")
    return eps.to(torch.float32).unsqueeze(-1)


@METHOD.loss(LOSS, columns=(CLIP_COLUMN,))
def compute_policy_loss_agpo_clip(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's vanilla PPO loss with row i clipped to [1 - eps_i, 1 + eps_i], eps the handed ``agpo_dual_clip_eps``."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla  # at call time: see recipe_apo.plugin

    if config is None:
        raise MethodConfigError(f"loss_mode={NAME} needs the actor config")
    eps = handed_column(CLIP_COLUMN)
    if eps is None:
        raise MethodConfigError(
            f"policy_loss.loss_mode={NAME} needs each prompt's clip in the batch (column {CLIP_COLUMN}): it runs "
            "under method=agpo_dual with the recipe's trainer, which computes the clips and hands them to the loss"
        )
    eps = check_clip(eps, advantages.shape[0]).to(advantages.device)
    loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask,
                                                loss_agg_mode, _PerRowClip(config, eps), rollout_is_weights)
    mask = response_mask.to(eps.dtype)
    tokens = mask.sum()
    metrics[CLIP_METRIC] = float((eps * mask).sum() / tokens) if tokens > 0 else 0.0
    return loss, metrics
