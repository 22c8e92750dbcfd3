"""The actor update, as verl's ``ppo_loss`` and FSDP actor run it: a real verl actor config, the registered
policy loss called with verl's arguments, ``global_batch_info`` refreshed per micro-batch so the loss of a
mini-batch does not depend on how it is split, gradient clipping at ``grad_clip``.

A method's runtime may set a mini-batch's loss denominators itself (``loss_denominators``: the zero-variance
denominator's testbed-only ``exact``) or note what they are off by (its ``exclude``); a method's loss may read
per-row columns its runtime computed (``loss_columns``: AGPO's clip), handed micro-batch by micro-batch as the
recipe's trainer hands them in verl's actor (``recipe_apo.methods.loss_inputs``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch
from omegaconf import OmegaConf

from recipe_apo.methods.base import MethodRuntime
from recipe_apo.methods.checks import RATIO_BAND
from recipe_apo.methods.checks import effective_agg_mode as _effective
from recipe_apo.methods.loss_inputs import handed_columns
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.policy import TokenPolicy
from recipe_apo.testbed.settings import VERL_NOT_FROM_YAML


def actor_config(actor: Any, rollout_n: int):
    """verl's ``FSDPActorConfig`` from the ``actor_rollout_ref.actor`` node (a DictConfig or its plain values).

    Every scalar key of the node that is a field of verl's config is passed on, so any verl actor setting a
    registered loss reads (``clip_ratio_c``, ``tau_pos``, ``policy_loss.clip_cov_ratio`` ...) can be set from
    the command line. ``ppo_mini_batch_size`` is in prompts, as in verl. ``use_kl_loss`` adds verl's KL loss
    against the run's initial policy (``ppo_update``'s ``ref_log_prob``); its ``kl_loss_type`` must be one verl's
    ``kl_penalty`` computes.
    """
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    plain = OmegaConf.to_container(actor, resolve=True) if OmegaConf.is_config(actor) else actor
    if plain.get("entropy_coeff"):
        # Accepted and ignored, it would let a sweep over it measure noise.
        raise TestbedSettingError(
            f"actor_rollout_ref.actor.entropy_coeff={plain['entropy_coeff']}: the testbed has no entropy bonus; "
            "set it to 0"
        )
    if plain.get("use_kl_loss"):
        check_kl_type(plain.get("kl_loss_type"))
    known = {f.name for f in dataclasses.fields(FSDPActorConfig)}
    kwargs = {key: value for key, value in plain.items() if key in known and key not in VERL_NOT_FROM_YAML}
    loss_fields = {f.name for f in dataclasses.fields(PolicyLossConfig)} - {"rollout_correction"}
    policy_loss = PolicyLossConfig(**{k: v for k, v in plain.get("policy_loss", {}).items() if k in loss_fields})
    return FSDPActorConfig(strategy="fsdp2", rollout_n=rollout_n, policy_loss=policy_loss, **kwargs)


def check_kl_type(kind: Any) -> None:
    """Refuse a ``kl_loss_type`` verl's ``kl_penalty`` does not compute (it raises only when called)."""
    from verl.trainer.ppo.core_algos import kl_penalty

    try:
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), str(kind))
    except (NotImplementedError, ValueError, KeyError) as exc:
        raise TestbedSettingError(f"actor_rollout_ref.actor.kl_loss_type={kind}: not a KL estimator verl computes "
                                  "(k1, k2, k3, low_var_kl, abs, mse, kl, with an optional + suffix)") from exc


def effective_agg_mode(config: Any) -> str:
    """The aggregation the loss really applies: ``loss_agg_mode``, unless the loss has its own (verl's sapo)."""
    return _effective(config.policy_loss.loss_mode, config.loss_agg_mode)


def ppo_update(
    policy: TokenPolicy,
    optimizer: torch.optim.Optimizer,
    config: Any,
    batch: dict[str, Any],
    advantages: torch.Tensor,
    old_log_prob: torch.Tensor,
    shuffle_generator: torch.Generator,
    runtimes: Sequence[MethodRuntime] = (),
    trace: Optional[list] = None,
    loss_columns: Optional[Mapping[str, torch.Tensor]] = None,
    ref_log_prob: Optional[torch.Tensor] = None,
) -> dict[str, float]:
    """``ppo_epochs`` passes over the round's responses in mini-batches of ``ppo_mini_batch_size`` prompts.

    Returns the mean loss metrics, the mean mini-batch loss (``pg_loss``) and the gradient norm before
    clipping (an adaptive optimizer rescales its steps, so the update norm would hide how large the loss
    gradient was), and ``ratio_out_share``: the share of valid tokens whose ratio r = pi / pi_old lay outside
    [1 - 0.2, 1 + 0.2] (GRPO's clip range) when their loss was computed, the same measure for every loss.
    ``runtimes``: the round's method runtimes; each one's ``loss_denominators(rows, mask)`` may set a mini-batch's
    denominators (``responses``, ``tokens``) or note something of it (every other key goes into the ``trace``).
    ``trace``, when a list, gets one entry per mini-batch: its rows, its loss and those notes.

    ``loss_columns`` (name -> one value per response): each micro-batch's loss is called inside
    ``loss_inputs.handed_columns`` with its rows' values, as the recipe's ``ColumnLoss`` hands them in verl.
    ``ref_log_prob`` (the reference policy's log-probs of the responses): needed with ``use_kl_loss``, whose
    ``kl_loss_coef`` x ``kl_penalty(log_prob, ref_log_prob, kl_loss_type)``, aggregated by ``agg_loss`` with the
    ``loss_agg_mode`` and the mini-batch's denominators, is added to each micro-batch's loss as verl's
    ``ppo_loss`` adds it (metric ``actor/kl_loss``: a mini-batch's, the mean over the mini-batches).
    """
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    if config.use_kl_loss and ref_log_prob is None:
        raise ValueError("actor_rollout_ref.actor.use_kl_loss=true needs the reference policy's log-probs")
    rows_total = batch["responses"].shape[0]
    for name, values in (loss_columns or {}).items():
        if values.shape[0] != rows_total:
            raise ValueError(f"loss column {name}: {values.shape[0]} values for {rows_total} responses")
    loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
    extra = _Extras(dict(loss_columns or {}), ref_log_prob if config.use_kl_loss else None)
    mask = batch["response_mask"].to(torch.bool)
    stats = _UpdateStats()
    micro = config.ppo_micro_batch_size_per_gpu or config.ppo_mini_batch_size * config.rollout_n
    for rows in mini_batches(config, rows_total, shuffle_generator):
        responses, valid_tokens, notes = len(rows), int(mask[rows].sum()), {}
        for runtime in runtimes:
            said = runtime.loss_denominators(rows, mask) or {}
            responses, valid_tokens = said.pop("responses", responses), said.pop("tokens", valid_tokens)
            notes.update(said)
        # What verl's trainer and ppo_loss put there for each micro-batch of this mini-batch.
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
            mini_loss += _micro_batch_loss(policy, loss_fn, config, batch, advantages, old_log_prob, mask, part,
                                           stats, extra)
        stats.losses.append(mini_loss)
        if extra.ref_log_prob is not None:
            stats.kl_losses.append(stats.kl_mini)
            stats.kl_mini = 0.0
        if trace is not None:
            trace.append({"rows": rows.tolist(), "loss": mini_loss, **notes})
        stats.grad_norms.append(_step(policy, optimizer, config.grad_clip))
    return stats.summary()


def mini_batches(config: Any, n: int, shuffle_generator: torch.Generator) -> Iterator[torch.Tensor]:
    """The rows of each mini-batch of ``ppo_mini_batch_size`` prompts (``rollout_n`` rows each), over
    ``ppo_epochs`` passes, each pass in a fresh order when ``shuffle``."""
    mini = config.ppo_mini_batch_size * config.rollout_n
    for _ in range(config.ppo_epochs):
        order = torch.randperm(n, generator=shuffle_generator) if config.shuffle else torch.arange(n)
        for start in range(0, n, mini):
            yield order[start : start + mini]


@dataclasses.dataclass
class _UpdateStats:
    """What the passes of one update add up: the loss metrics, mini-batch losses, gradient norms, and the valid
    tokens whose |r - 1| exceeded ``RATIO_BAND`` (``outside``) among all valid tokens (``seen``)."""

    metric_sums: dict[str, float] = dataclasses.field(default_factory=dict)
    metric_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    losses: list[float] = dataclasses.field(default_factory=list)
    # The KL loss (use_kl_loss): the current mini-batch's, summed over its micro-batches, and each mini-batch's.
    kl_mini: float = 0.0
    kl_losses: list[float] = dataclasses.field(default_factory=list)
    grad_norms: list[float] = dataclasses.field(default_factory=list)
    outside: int = 0
    seen: int = 0

    def add_metrics(self, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            value = float(value)
            if math.isfinite(value):
                self.metric_sums[key] = self.metric_sums.get(key, 0.0) + value
                self.metric_counts[key] = self.metric_counts.get(key, 0) + 1

    def summary(self) -> dict[str, float]:
        out = {key: self.metric_sums[key] / self.metric_counts[key] for key in self.metric_sums}
        out["pg_loss"] = sum(self.losses) / len(self.losses)
        out["grad_norm"] = sum(self.grad_norms) / len(self.grad_norms)
        out["grad_norm_max"] = max(self.grad_norms)
        out["ratio_out_share"] = self.outside / max(self.seen, 1)
        if self.kl_losses:
            out["actor/kl_loss"] = sum(self.kl_losses) / len(self.kl_losses)
        return out


@dataclasses.dataclass
class _Extras:
    """What a micro-batch's loss may take beyond verl's arguments: the methods' loss columns, the reference
    log-probs (KL)."""

    loss_columns: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    ref_log_prob: Optional[torch.Tensor] = None


def _micro_batch_loss(policy: TokenPolicy, loss_fn: Any, config: Any, batch: dict[str, Any],
                      advantages: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor,
                      part: torch.Tensor, stats: _UpdateStats, extra: Optional[_Extras] = None) -> float:
    """The registered loss of the micro-batch ``part`` as verl calls it (with the rows' loss columns handed),
    plus verl's KL loss when ``use_kl_loss``, its gradient accumulated; returns the loss and adds its metrics and
    ratio band counts to ``stats``."""
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    extra = extra or _Extras()
    log_prob = policy.log_probs(batch["prompts"][part], batch["responses"][part])
    with torch.no_grad():
        valid = mask[part]
        deviation = (log_prob - old_log_prob[part]).exp().sub_(1.0).abs_()
        stats.outside += int((deviation > RATIO_BAND).logical_and_(valid).sum())
        stats.seen += int(valid.sum())
    handed = {name: values[part] for name, values in extra.loss_columns.items()}
    with handed_columns(handed) if handed else contextlib.nullcontext():
        loss, metrics = loss_fn(
            old_log_prob=old_log_prob[part],
            log_prob=log_prob,
            advantages=advantages[part],
            response_mask=mask[part],
            loss_agg_mode=config.loss_agg_mode,
            config=config,
            rollout_is_weights=None,
        )
    if extra.ref_log_prob is not None:
        # verl's ppo_loss: + kl_loss_coef * agg_loss(kl_penalty(log pi, log pi_ref)), its denominators the
        # mini-batch's (global_batch_info).
        kld = kl_penalty(logprob=log_prob, ref_logprob=extra.ref_log_prob[part], kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld, loss_mask=mask[part], loss_agg_mode=config.loss_agg_mode,
                           **config.global_batch_info)
        loss = loss + kl_loss * config.kl_loss_coef
        stats.kl_mini += float(kl_loss.detach())
    loss.backward()
    stats.add_metrics(metrics)
    return float(loss.detach())


def _step(policy: TokenPolicy, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the mini-batch's gradient at ``grad_clip`` and step; returns its norm before clipping."""
    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip))
    # verl skips the step when the norm is not finite rather than poisoning the weights.
    if math.isfinite(grad_norm):
        optimizer.step()
    return grad_norm
