"""The actor update, as verl's ``ppo_loss`` and FSDP actor run it: a real verl actor config, the registered
policy loss called with verl's arguments, ``global_batch_info`` refreshed per micro-batch so the loss of a
mini-batch does not depend on how it is split, gradient clipping at ``grad_clip``.

``algorithm.zero_variance``: with ``exclude`` the advantages come in already scaled by the round's
B / B_live (recipe_apo/methods/zero_variance.py) and the update records how far that is off per mini-batch
(``denominator_ratio``); with ``exact`` (testbed only) the advantages are left as they are and each
mini-batch's own denominators count only its live responses and tokens.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from recipe_apo.integration.validation import OWN_AGGREGATION
from recipe_apo.methods.apo_loss import RATIO_BAND
from recipe_apo.methods.zero_variance import denominator_ratio
from recipe_apo.testbed.policy import TokenPolicy

# algorithm.zero_variance in the testbed: the recipe's two, and the exact reference the recipe cannot run.
ZERO_VARIANCE_MODES = ("keep", "exclude", "exact")

# Nested or runtime-only fields of verl's actor config that the testbed does not take from its yaml.
_NOT_FROM_YAML = {"policy_loss", "optim", "checkpoint", "fsdp_config", "profiler", "engine", "model_config",
                  "qat", "global_batch_info", "strategy", "rollout_n", "router_replay", "megatron"}


def actor_config(actor: DictConfig, rollout_n: int):
    """verl's ``FSDPActorConfig`` from the composed ``actor_rollout_ref.actor`` node.

    Every scalar key of the node that is a field of verl's config is passed on, so any verl actor setting a
    registered loss reads (``clip_ratio_c``, ``tau_pos``, ``policy_loss.clip_cov_ratio`` ...) can be set from
    the command line. ``ppo_mini_batch_size`` is in prompts, as in verl.
    """
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    plain = OmegaConf.to_container(actor, resolve=True)
    if plain.get("use_kl_loss"):
        raise ValueError("the testbed has no reference policy: actor_rollout_ref.actor.use_kl_loss must be false")
    if plain.get("entropy_coeff"):
        # Accepted and ignored, it would let a sweep over it measure noise.
        raise ValueError(
            f"actor_rollout_ref.actor.entropy_coeff={plain['entropy_coeff']}: the testbed has no entropy bonus; "
            "set it to 0"
        )
    known = {f.name for f in dataclasses.fields(FSDPActorConfig)}
    kwargs = {key: value for key, value in plain.items() if key in known and key not in _NOT_FROM_YAML}
    loss_fields = {f.name for f in dataclasses.fields(PolicyLossConfig)} - {"rollout_correction"}
    policy_loss = PolicyLossConfig(**{k: v for k, v in plain.get("policy_loss", {}).items() if k in loss_fields})
    return FSDPActorConfig(strategy="fsdp2", rollout_n=rollout_n, policy_loss=policy_loss, **kwargs)


def effective_agg_mode(config: Any) -> str:
    """The aggregation the loss really applies: ``loss_agg_mode``, unless the loss has its own (verl's sapo)."""
    return OWN_AGGREGATION.get(config.policy_loss.loss_mode, config.loss_agg_mode)


def ppo_update(
    policy: TokenPolicy,
    optimizer: torch.optim.Optimizer,
    config: Any,
    batch: dict[str, Any],
    advantages: torch.Tensor,
    old_log_prob: torch.Tensor,
    shuffle_generator: torch.Generator,
    zero_variance: str = "keep",
    live: Optional[np.ndarray] = None,
    trace: Optional[list] = None,
) -> dict[str, float]:
    """``ppo_epochs`` passes over the round's responses in mini-batches of ``ppo_mini_batch_size`` prompts.

    Returns the mean loss metrics, the mean mini-batch loss (``pg_loss``) and the gradient norm before
    clipping (an adaptive optimizer rescales its steps, so the update norm would hide how large the loss
    gradient was), and ``ratio_out_share``: the share of valid tokens whose ratio r = pi / pi_old lay outside
    [1 - 0.2, 1 + 0.2] (GRPO's clip range) when their loss was computed, the same measure for every loss.
    ``live``: per response, is its group live (``zero_variance.live_rows``); needed for
    ``zero_variance`` exclude (then ``zv_ratio_dev_mean`` / ``zv_ratio_dev_max``: mean and max over the
    round's mini-batches of |denominator_ratio - 1|) and exact. ``trace``, when a list, gets one entry per
    mini-batch: its rows, its loss and (exclude) its denominator ratio.
    """
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    if zero_variance not in ZERO_VARIANCE_MODES:
        raise ValueError(
            f"algorithm.zero_variance must be one of {', '.join(ZERO_VARIANCE_MODES)}, got {zero_variance!r}")
    if zero_variance != "keep" and live is None:
        raise ValueError(f"zero_variance={zero_variance} needs the live responses of the round")
    loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
    n = batch["responses"].shape[0]
    mini = config.ppo_mini_batch_size * config.rollout_n
    micro = config.ppo_micro_batch_size_per_gpu or mini
    mask = batch["response_mask"].to(torch.bool)
    tokens = mask.sum(dim=-1).numpy().astype(np.float64)
    live_t = torch.from_numpy(np.asarray(live, dtype=bool)) if live is not None else None
    agg_mode = effective_agg_mode(config)
    grad_norms, metric_sums, metric_counts, losses, deviations = [], {}, {}, [], []
    outside, seen = 0, 0  # valid tokens with |r - 1| > RATIO_BAND, and all valid tokens, over every pass
    for _ in range(config.ppo_epochs):
        order = torch.randperm(n, generator=shuffle_generator) if config.shuffle else torch.arange(n)
        for start in range(0, n, mini):
            rows = order[start : start + mini]
            # What verl's trainer and ppo_loss put there for each micro-batch of this mini-batch.
            responses, valid_tokens = len(rows), int(mask[rows].sum())
            ratio = None
            if zero_variance == "exact":
                # The definition: the mini-batch's dead responses (advantage 0) leave its denominators. With no
                # live response the loss is 0 whatever the denominator; the plain one avoids dividing by 0.
                live_rows_ = rows[live_t[rows]]
                if len(live_rows_):
                    responses, valid_tokens = len(live_rows_), int(mask[live_rows_].sum())
            elif zero_variance == "exclude":
                ratio = denominator_ratio(np.asarray(live, dtype=bool), rows.numpy(), tokens, agg_mode)
                deviations.append(abs(ratio - 1.0))
            config.global_batch_info.update(
                dp_size=1,
                global_batch_size=responses,
                batch_num_tokens=valid_tokens,
                loss_scale_factor=config.loss_scale_factor,
            )
            optimizer.zero_grad(set_to_none=True)
            mini_loss = 0.0
            for micro_start in range(0, len(rows), micro):
                part = rows[micro_start : micro_start + micro]
                log_prob = policy.log_probs(batch["prompts"][part], batch["responses"][part])
                with torch.no_grad():
                    valid = mask[part]
                    deviation = (log_prob - old_log_prob[part]).exp().sub_(1.0).abs_()
                    outside += int((deviation > RATIO_BAND).logical_and_(valid).sum())
                    seen += int(valid.sum())
                loss, metrics = loss_fn(
                    old_log_prob=old_log_prob[part],
                    log_prob=log_prob,
                    advantages=advantages[part],
                    response_mask=mask[part],
                    loss_agg_mode=config.loss_agg_mode,
                    config=config,
                    rollout_is_weights=None,
                )
                loss.backward()
                mini_loss += float(loss.detach())
                for key, value in metrics.items():
                    value = float(value)
                    if math.isfinite(value):
                        metric_sums[key] = metric_sums.get(key, 0.0) + value
                        metric_counts[key] = metric_counts.get(key, 0) + 1
            losses.append(mini_loss)
            if trace is not None:
                trace.append({"rows": rows.tolist(), "loss": mini_loss, "denominator_ratio": ratio})
            grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.grad_clip))
            grad_norms.append(grad_norm)
            # verl skips the step when the norm is not finite rather than poisoning the weights.
            if math.isfinite(grad_norm):
                optimizer.step()
    out = {key: metric_sums[key] / metric_counts[key] for key in metric_sums}
    out["pg_loss"] = sum(losses) / len(losses)
    out["grad_norm"] = sum(grad_norms) / len(grad_norms)
    out["grad_norm_max"] = max(grad_norms)
    out["ratio_out_share"] = outside / max(seen, 1)
    if deviations:
        out["zv_ratio_dev_mean"] = sum(deviations) / len(deviations)
        out["zv_ratio_dev_max"] = max(deviations)
    return out
