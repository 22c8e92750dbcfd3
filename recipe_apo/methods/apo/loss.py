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

**The one-sided gate** (``policy_loss.loss_mode=apo_one_sided``, not in the paper): the gate acts only where the
ratio moved in the advantage's direction, as PPO's clip does, and the loss is the plain ratio on the other side:

    g(r) = f(r) - f(1) + 1   where (r - 1) sign(A) > 0     (f(1) = 2 / tau_i)
    g(r) = r                  otherwise

and the per-token loss is -g(r) A_i^eff, with the same tau choice, aggregation and importance weights as ``apo``.
g is continuous with slope 1 at r = 1, so on-policy both losses give the same gradient. Why: the symmetric gate
also damps the restoring gradient of a token whose ratio moved *against* its advantage (A > 0 with r < 1, or
A < 0 with r > 1), and stale responses make those common (docs/testbed.md, "Stale responses").
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from recipe_apo.methods.apo import LOSS, METHOD, ONE_SIDED_LOSS
from recipe_apo.methods.base import Metric
from recipe_apo.methods.checks import L0_BOUNDS, NORM_MODE, RATIO_BAND, TEMPERATURE_BOUNDS, check_number
from recipe_apo.methods.errors import MethodConfigError

# The log-ratio clamp of verl's own policy losses.
LOG_RATIO_CLAMP = 20.0
# w(r) = 4 s (1 - s) < 0.5  <=>  |tau (r - 1)| > ln((1 + sqrt(1/2)) / (1 - sqrt(1/2))).
_LOW_WEIGHT_LOGIT = math.log((1.0 + math.sqrt(0.5)) / (1.0 - math.sqrt(0.5)))
# What both losses log that the reports show (``_gate_metrics`` logs more).
GATE_METRICS = {"actor/apo_gate_weight": Metric("w(r), the soft gate's mean weight over the update's tokens (1 "
                                                  "on-policy)", headline=True, trust=True)}



def _temperature(config: Any, key: str, mode: str) -> float:
    name = f"actor_rollout_ref.actor.{key} (loss_mode={mode})"
    low, high = TEMPERATURE_BOUNDS
    return float(check_number(name, getattr(config, key), MethodConfigError, low=low, high=high))


def _aggregation_kwargs(config: Any, loss_agg_mode: str, mode: str) -> dict:
    info = dict(getattr(config, "global_batch_info", None) or {})
    if info.get("loss_scale_factor") is None:
        info["loss_scale_factor"] = getattr(config, "loss_scale_factor", None)
    scale = info["loss_scale_factor"]
    if loss_agg_mode == NORM_MODE and scale is None:
        # agg_loss would fall back to the padded width of each micro-batch, which varies from one micro-batch
        # to the next and brings the length bias back.
        raise MethodConfigError(
            f"loss_mode={mode} with loss_agg_mode=seq-mean-token-sum-norm needs the constant L0: set "
            "actor_rollout_ref.actor.loss_scale_factor to the maximum response length (data.max_response_length)"
        )
    if loss_agg_mode == NORM_MODE:
        # Checked here, not only in the recipe's validation: plain verl hands the value over unchecked, and a
        # negative L0 flips the loss's sign, 0 makes it -inf.
        check_number(f"actor_rollout_ref.actor.loss_scale_factor (L0, loss_mode={mode})", scale, MethodConfigError,
                     low=L0_BOUNDS[0], high=L0_BOUNDS[1])
    return info


def _settings(config: Optional[Any], loss_agg_mode: str, mode: str) -> tuple[float, float, dict]:
    """tau_+, tau_- and agg_loss's keyword arguments, checked; ``mode`` names the loss in errors."""
    if config is None:
        raise MethodConfigError(f"loss_mode={mode} needs the actor config (tau_pos, tau_neg, loss_scale_factor)")
    return (_temperature(config, "tau_pos", mode), _temperature(config, "tau_neg", mode),
            _aggregation_kwargs(config, loss_agg_mode, mode))


def _ratio_and_temperature(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                           tau_pos: float, tau_neg: float) -> tuple[torch.Tensor, ...]:
    """(log r, r, A as float32, A > 0, tau_i per token)."""
    # The gate in float32 whatever the log-probs' dtype: in float16, exp of a log-ratio of 12 or more overflows
    # and the gradient turns NaN (verl's own losses share that failure). No copy for float32 inputs.
    log_ratio = torch.clamp(log_prob.float() - old_log_prob.float(), min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    advantages = advantages.float()
    positive = advantages > 0
    tau = torch.where(positive, tau_pos, tau_neg).to(ratio.dtype)
    return log_ratio, ratio, advantages, positive, tau


def _gate_metrics(
    log_ratio: torch.Tensor,
    ratio: torch.Tensor,
    logit: torch.Tensor,
    gate_sigmoid: torch.Tensor,
    response_mask: torch.Tensor,
    gated: Optional[torch.Tensor] = None,
) -> dict[str, float]:
    """The gate's metrics over valid tokens. ``gated``: where the gate acts (None: every token); elsewhere the
    token's weight dg/dr is 1 and it never counts as low-weight."""
    with torch.no_grad():
        # Few full-size passes and no float copies of boolean masks: these metrics run on every micro-batch.
        valid = response_mask.reshape(-1).to(torch.bool)
        mask = valid.to(ratio.dtype)
        n_tokens = mask.sum().clamp(min=1.0)
        s = gate_sigmoid.detach().reshape(-1)
        weight = 4.0 * (1.0 - s).mul_(s)
        low = logit.detach().reshape(-1).abs() > _LOW_WEIGHT_LOGIT
        if gated is not None:
            gated = gated.reshape(-1)
            weight = torch.where(gated, weight, 1.0)
            low = low.logical_and_(gated)
        gate_weight = weight.mul_(mask).sum() / n_tokens
        low_weight = torch.count_nonzero(low.logical_and_(valid))
        out_of_band = torch.count_nonzero(((ratio.detach().reshape(-1) - 1.0).abs_() > RATIO_BAND).logical_and_(valid))
        ppo_kl = -log_ratio.detach().reshape(-1).mul(mask).sum() / n_tokens
        parts = [gate_weight, low_weight / n_tokens, out_of_band / n_tokens, ppo_kl]
        if gated is not None:
            parts.append(torch.count_nonzero(gated.logical_and(valid)) / n_tokens)
        # One device-to-host transfer for all the metrics.
        values = torch.stack(parts).tolist()
    metrics = {
        "actor/apo_gate_weight": values[0],
        "actor/apo_gate_low_share": values[1],
        "actor/apo_ratio_out_share": values[2],
        "actor/ppo_kl": values[3],
    }
    if gated is not None:
        metrics["actor/apo_gate_active_share"] = values[4]
    return metrics


@METHOD.loss(LOSS, metrics=GATE_METRICS)
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
    from verl.trainer.ppo.core_algos import agg_loss  # at call time: see recipe_apo.plugin

    tau_pos, tau_neg, aggregation = _settings(config, loss_agg_mode, "apo")
    log_ratio, ratio, advantages, positive, tau = _ratio_and_temperature(old_log_prob, log_prob, advantages,
                                                                        tau_pos, tau_neg)
    # -(4 / tau) * A needs no gradient: built once, so the graph holds a single product with the sigmoid.
    scaled_advantages = torch.where(positive, -4.0 / tau_pos, -4.0 / tau_neg).to(ratio.dtype).mul_(advantages)
    logit = (ratio - 1.0).mul_(tau)
    gate_sigmoid = torch.sigmoid(logit)
    pg_losses = gate_sigmoid * scaled_advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **aggregation)
    return pg_loss, _gate_metrics(log_ratio, ratio, logit, gate_sigmoid, response_mask)


@METHOD.loss(ONE_SIDED_LOSS, metrics=GATE_METRICS)
def compute_policy_loss_apo_one_sided(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = NORM_MODE,
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's policy-loss signature for ``policy_loss.loss_mode=apo_one_sided`` (the module's docstring: g(r));
    returns (loss, metrics), ``apo``'s plus ``actor/apo_gate_active_share`` (the share of tokens gated)."""
    from verl.trainer.ppo.core_algos import agg_loss  # at call time: see recipe_apo.plugin

    tau_pos, tau_neg, aggregation = _settings(config, loss_agg_mode, "apo_one_sided")
    log_ratio, ratio, advantages, positive, tau = _ratio_and_temperature(old_log_prob, log_prob, advantages,
                                                                        tau_pos, tau_neg)
    logit = (ratio - 1.0).mul_(tau)
    gate_sigmoid = torch.sigmoid(logit)
    # (r - 1) sign(A) > 0, from the graph-free tensors: A = 0 is never gated (its loss is 0 either way).
    with torch.no_grad():
        gated = torch.where(positive, log_ratio > 0, (advantages < 0).logical_and(log_ratio < 0))
    # f(r) - f(1) + 1 = (4 / tau) (sigmoid - 1/2) + 1.
    gate = (gate_sigmoid - 0.5).mul(4.0 / tau).add(1.0)
    pg_losses = -torch.where(gated, gate, ratio) * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **aggregation)
    return pg_loss, _gate_metrics(log_ratio, ratio, logit, gate_sigmoid, response_mask, gated)
