"""The APO policy loss: a soft gate with asymmetric temperatures (APO paper, sections 4.6-4.7).

Paper symbols and their names here, per valid token t of response i:

- r_{i,t} = pi_theta / pi_theta_old: ``ratio`` (the log-ratio is clamped to [-20, 20] as verl's losses do).
- tau_i = tau_+ if A_i^eff > 0 else tau_-: ``tau``, from verl's actor fields ``tau_pos`` / ``tau_neg``.
- f_i(r) = (4 / tau_i) sigmoid(tau_i (r - 1)): ``gate``; df/dr = 1 at r = 1, bounded in [0, 4 / tau_i].
- w(r) = 4 s (1 - s), s = sigmoid(tau_i (r - 1)): the gate's effective weight, logged as a metric.
- L0: the constant token budget, verl's ``actor_rollout_ref.actor.loss_scale_factor``.

Per-token loss is -f_i(r) A_i^eff (times ``rollout_is_weights`` when verl passes them), aggregated by verl's
``agg_loss`` with the *configured* ``loss_agg_mode`` and the global batch info that verl refreshes for each
micro-batch. The APO objective (1/G) sum_i (1/L0) sum_t f_i A_i^eff is ``seq-mean-token-sum-norm`` with
``loss_scale_factor = L0``. (verl's built-in ``sapo`` has the same gate but always aggregates with
``seq-mean-token-mean``, i.e. GRPO's 1/|o_i|; this loss honours the configured mode instead.)
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from verl.trainer.ppo.core_algos import agg_loss

from recipe_apo.methods.checks import NORM_MODE, check_number
from recipe_apo.methods.errors import MethodConfigError

# The log-ratio clamp of verl's own policy losses.
LOG_RATIO_CLAMP = 20.0
# Ratio band of the `ratio outside band` metric: GRPO's default clip range, so the share reads like its clip
# fraction.
RATIO_BAND = 0.2
# w(r) = 4 s (1 - s) < 0.5  <=>  |tau (r - 1)| > ln((1 + sqrt(1/2)) / (1 - sqrt(1/2))).
_LOW_WEIGHT_LOGIT = math.log((1.0 + math.sqrt(0.5)) / (1.0 - math.sqrt(0.5)))



def _temperature(config: Any, key: str) -> float:
    name = f"actor_rollout_ref.actor.{key} (loss_mode=apo)"
    return float(check_number(name, getattr(config, key), MethodConfigError, low=0.0, low_open=True))


def _aggregation_kwargs(config: Any, loss_agg_mode: str) -> dict:
    info = dict(getattr(config, "global_batch_info", None) or {})
    if info.get("loss_scale_factor") is None:
        info["loss_scale_factor"] = getattr(config, "loss_scale_factor", None)
    scale = info["loss_scale_factor"]
    if loss_agg_mode == NORM_MODE and scale is None:
        # agg_loss would fall back to the padded width of each micro-batch, which varies from one micro-batch
        # to the next and brings the length bias back.
        raise MethodConfigError(
            "loss_mode=apo with loss_agg_mode=seq-mean-token-sum-norm needs the constant L0: set "
            "actor_rollout_ref.actor.loss_scale_factor to the maximum response length (data.max_response_length)"
        )
    if loss_agg_mode == NORM_MODE:
        # Checked here, not only in the recipe's validation: plain verl hands the value over unchecked, and a
        # negative L0 flips the loss's sign, 0 makes it -inf.
        check_number("actor_rollout_ref.actor.loss_scale_factor (L0, loss_mode=apo)", scale, MethodConfigError,
                     low=0.0, low_open=True)
    return info


def compute_policy_loss_apo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = NORM_MODE,
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's policy-loss signature for ``policy_loss.loss_mode=apo``; returns (loss, metrics)."""
    if config is None:
        raise MethodConfigError("loss_mode=apo needs the actor config (tau_pos, tau_neg, loss_scale_factor)")
    tau_pos = _temperature(config, "tau_pos")
    tau_neg = _temperature(config, "tau_neg")
    aggregation = _aggregation_kwargs(config, loss_agg_mode)

    # The gate in float32 whatever the log-probs' dtype: in float16, exp of a log-ratio of 12 or more overflows
    # and the gradient turns NaN (verl's own losses share that failure). No copy for float32 inputs.
    log_ratio = torch.clamp(log_prob.float() - old_log_prob.float(), min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    advantages = advantages.float()
    ratio = torch.exp(log_ratio)
    positive = advantages > 0
    tau = torch.where(positive, tau_pos, tau_neg).to(ratio.dtype)
    # -(4 / tau) * A needs no gradient: built once, so the graph holds a single product with the sigmoid.
    scaled_advantages = torch.where(positive, -4.0 / tau_pos, -4.0 / tau_neg).to(ratio.dtype).mul_(advantages)
    logit = (ratio - 1.0).mul_(tau)
    gate_sigmoid = torch.sigmoid(logit)
    pg_losses = gate_sigmoid * scaled_advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **aggregation)

    with torch.no_grad():
        # Few full-size passes and no float copies of boolean masks: these metrics run on every micro-batch.
        valid = response_mask.reshape(-1).to(torch.bool)
        mask = valid.to(ratio.dtype)
        n_tokens = mask.sum().clamp(min=1.0)
        s = gate_sigmoid.detach().reshape(-1)
        gate_weight = 4.0 * (1.0 - s).mul_(s).mul_(mask).sum() / n_tokens
        low_weight = torch.count_nonzero((logit.detach().reshape(-1).abs() > _LOW_WEIGHT_LOGIT).logical_and_(valid))
        out_of_band = torch.count_nonzero(((ratio.detach().reshape(-1) - 1.0).abs_() > RATIO_BAND).logical_and_(valid))
        ppo_kl = -log_ratio.detach().reshape(-1).mul(mask).sum() / n_tokens
        # One device-to-host transfer for all four metrics.
        values = torch.stack([gate_weight, low_weight / n_tokens, out_of_band / n_tokens, ppo_kl]).tolist()
    metrics = {
        "actor/apo_gate_weight": values[0],
        "actor/apo_gate_low_share": values[1],
        "actor/apo_ratio_out_share": values[2],
        "actor/ppo_kl": values[3],
    }
    return pg_loss, metrics
