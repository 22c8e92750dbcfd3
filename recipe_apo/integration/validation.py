"""Checks of a composed training config, run in the launching process before Ray starts.

A wrong setting found here costs a second and one line naming the key; found in a Ray worker it costs a
model load, a rollout and a traceback.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import OmegaConf

from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.flags import check_flags
from recipe_apo.integration.modes import ASYNC_MODES, is_recipe_trainer, verl_mode
from recipe_apo.methods.apo_loss import NORM_MODE
from recipe_apo.methods.apo_settings import ApoConfigError, ApoSettings
from recipe_apo.methods.codapo import CodapoConfigError, CodapoSettings
from recipe_apo.methods.zero_variance import check_mode as check_zero_variance

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", NORM_MODE)
# Estimators that compare the responses of one prompt with each other: a group of one carries no signal.
GROUP_ESTIMATORS = ("apo", "codapo", "grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "grpo_passk", "opo", "gdpo")
# Policy losses of verl 0.9.1 that aggregate their own way, whatever loss_agg_mode says. geo_mean never calls
# agg_loss: its torch.mean over sequences is seq-mean-token-mean's shape, but per micro-batch (PER_MICRO_BATCH_MEAN).
OWN_AGGREGATION = {"sapo": "seq-mean-token-mean", "geo_mean": "seq-mean-token-mean"}
# What else to do, after "set that", when loss_agg_mode disagrees.
_OWN_AGGREGATION_ALTERNATIVE = {"sapo": ", or use loss_mode=apo (same gate, any mode)"}
# Policy losses of verl 0.9.1 that average over each micro-batch and ignore verl's global batch size: k micro-batches
# per rank give k times the update (tests/e2e/test_gradient_invariance.py measures it).
PER_MICRO_BATCH_MEAN = ("geo_mean",)
# verl's driver calls these two without looking them up in the registry.
HARD_WIRED_ESTIMATORS = ("gae", "grpo")
# verl 0.9.1's own agent loops, each returning one output per trajectory (single_turn_agent_loop.py,
# tool_agent_loop.py); any other loop may return several (recipe_apo.integration.multi_output).
SINGLE_OUTPUT_AGENT_LOOPS = ("single_turn_agent", "tool_agent")


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


# The CPU rehearsal's rollout backend (recipe_apo/cpu/), registered only when the rehearsal is on.
REHEARSAL_ROLLOUT = "hf"


def _refuse_silent_combinations(algorithm: Any, actor: Any, estimator: str, loss_mode: str) -> None:
    """Settings that verl accepts but that do something other than what they say."""
    norm_by_std = bool(algorithm.get("norm_adv_by_std_in_grpo", True))
    if estimator == "grpo_vectorized" and not norm_by_std:
        raise RecipeConfigError(
            "algorithm.adv_estimator=grpo_vectorized ignores algorithm.norm_adv_by_std_in_grpo=false in verl 0.9.1 "
            "(it always divides by the std): use algorithm.adv_estimator=grpo for Dr. GRPO's centered advantages"
        )
    if estimator == "apo" and norm_by_std:
        raise RecipeConfigError(
            "algorithm.norm_adv_by_std_in_grpo=true is not read by algorithm.adv_estimator=apo (APO never divides "
            "by the group's std): set it to false, or use adv_estimator=grpo for std-normalized advantages"
        )
    agg_mode = str(actor.loss_agg_mode)
    if loss_mode in OWN_AGGREGATION and agg_mode != OWN_AGGREGATION[loss_mode]:
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} ignores loss_agg_mode={agg_mode}: verl's "
            f"{loss_mode} always aggregates with {OWN_AGGREGATION[loss_mode]}; set that"
            + _OWN_AGGREGATION_ALTERNATIVE.get(loss_mode, "")
        )
    if actor.get("loss_scale_factor", None) is not None and agg_mode != NORM_MODE:
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.loss_scale_factor={actor.get('loss_scale_factor')} is only read with "
            f"loss_agg_mode={NORM_MODE} (got {agg_mode}): set it to null, or use that mode for a constant L0"
        )


def validate_recipe_config(config: Any, rehearsal: bool = False) -> None:
    """Raise ``RecipeConfigError`` for the first invalid setting of a resolved trainer config.

    ``rehearsal``: the job runs the CPU rehearsal (``rehearsal=cpu``), whose own checks ran already.
    """
    from verl.trainer.ppo import core_algos

    import recipe_apo  # noqa: F401  (registers apo in this process even with VERL_USE_EXTERNAL_PLUGINS=none)

    # First: every later check reads these flags with Python's truth, which takes 'false' for true.
    check_flags(config)
    algorithm = config.algorithm
    actor = config.actor_rollout_ref.actor
    estimator = str(algorithm.adv_estimator)

    try:
        settings = ApoSettings.from_algorithm_config(algorithm)
        codapo = CodapoSettings.from_algorithm_config(algorithm)
    except (ApoConfigError, CodapoConfigError) as exc:
        raise RecipeConfigError(str(exc)) from None
    mode = str(config.trainer.get("v1", {}).get("trainer_mode", "sync"))
    recipe_trainer = is_recipe_trainer(mode)
    zero_variance = algorithm.get("zero_variance", "keep")
    if zero_variance == "exact":
        raise RecipeConfigError(
            "algorithm.zero_variance=exact is the testbed's reference (a per-mini-batch denominator that verl's "
            "actor does not expose): use algorithm.zero_variance=exclude"
        )
    try:
        check_zero_variance(zero_variance, str(actor.loss_agg_mode), algorithm.get("use_kl_in_reward", False))
    except ValueError as exc:
        raise RecipeConfigError(str(exc)) from None
    if zero_variance == "exclude" and not recipe_trainer:
        raise RecipeConfigError(
            f"algorithm.zero_variance=exclude needs the recipe's trainer (trainer.v1.trainer_mode=sync, "
            f"colocate_async or separate_async; got {mode}): only the recipe's trainer rescales the advantages"
        )
    if estimator == "codapo":
        if not recipe_trainer:
            raise RecipeConfigError(
                f"algorithm.adv_estimator=codapo needs the recipe's trainer (trainer.v1.trainer_mode=sync, "
                f"colocate_async or separate_async; got {mode}): only the recipe's trainer hands the old policy's "
                "log-probs to the estimator" + (" and resamples prompts" if codapo.resample else "")
            )
        if codapo.resample and verl_mode(mode) in ASYNC_MODES:
            raise RecipeConfigError(
                f"algorithm.codapo.resample=true with trainer.v1.trainer_mode={verl_mode(mode)}: CoDaPO's second "
                "step of a pair trains on prompts kept from the first, but verl's asynchronous trainers draw "
                "prompts ahead of their step (warm-up, refills); set algorithm.codapo.resample=false (the "
                "confidence-difficulty weighting alone) or use trainer.v1.trainer_mode=sync"
            )
        filter_groups = algorithm.get("filter_groups", None) or {}
        if codapo.resample and filter_groups.get("enable", False):
            raise RecipeConfigError(
                "algorithm.filter_groups.enable=true with algorithm.codapo.resample=true: verl's group filter "
                "refills a step with new loader prompts, which breaks CoDaPO's pairs; set one of them to false"
            )
        gen_batch = config.data.get("gen_batch_size", None)
        if codapo.resample and gen_batch not in (None, config.data.train_batch_size):
            raise RecipeConfigError(
                f"data.gen_batch_size={gen_batch} with algorithm.codapo.resample=true: the resampled step builds "
                f"one batch of data.train_batch_size prompts; unset gen_batch_size or set resample=false"
            )

    if not config.trainer.get("use_v1", True):
        raise RecipeConfigError("trainer.use_v1=false: the recipe runs verl's V1 trainer; set trainer.use_v1=true")
    if estimator == "apo":
        if algorithm.get("use_kl_in_reward", False) and settings.success != "threshold":
            # The summed token rewards then carry -beta * KL and leave [0, 1]: the first step would stop.
            raise RecipeConfigError(
                f"algorithm.use_kl_in_reward=true with algorithm.apo.success={settings.success}: KL-penalised "
                "rewards leave the success range; use algorithm.apo.success=threshold or the KL loss "
                "(actor_rollout_ref.actor.use_kl_loss=true)"
            )
        if settings.anchor_scope == "data_source" and not recipe_trainer:
            raise RecipeConfigError(
                f"algorithm.apo.anchor_scope=data_source needs the recipe's trainer (trainer.v1.trainer_mode=sync, "
                f"colocate_async or separate_async; got {mode}): only the recipe's trainer hands data sources to "
                "the estimator"
            )

    if estimator not in HARD_WIRED_ESTIMATORS and estimator not in core_algos.ADV_ESTIMATOR_REGISTRY:
        known = ", ".join(sorted(set(core_algos.ADV_ESTIMATOR_REGISTRY) | set(HARD_WIRED_ESTIMATORS)))
        raise RecipeConfigError(f"algorithm.adv_estimator={estimator} is not a registered estimator; known: {known}")

    loss_mode = str(actor.policy_loss.loss_mode)
    if loss_mode not in core_algos.POLICY_LOSS_REGISTRY:
        known = ", ".join(sorted(core_algos.POLICY_LOSS_REGISTRY))
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} is not a registered policy loss; known: {known}"
        )

    _refuse_silent_combinations(algorithm, actor, estimator, loss_mode)

    agg_mode = str(actor.loss_agg_mode)
    if agg_mode not in AGG_MODES:
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.loss_agg_mode={agg_mode} is not one of {', '.join(AGG_MODES)}"
        )
    scale = actor.get("loss_scale_factor", None)
    if agg_mode == NORM_MODE and scale is None:
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.loss_scale_factor (L0) must be set with loss_agg_mode={NORM_MODE}: "
            "set it to data.max_response_length"
        )
    if scale is not None and not _positive_number(scale):
        raise RecipeConfigError(f"actor_rollout_ref.actor.loss_scale_factor must be a number > 0, got {scale!r}")

    if loss_mode == "apo":
        for key in ("tau_pos", "tau_neg"):
            if not _positive_number(actor.get(key)):
                raise RecipeConfigError(f"actor_rollout_ref.actor.{key} must be a number > 0, got {actor.get(key)!r}")

    if OmegaConf.is_missing(config.actor_rollout_ref.rollout, "name"):
        raise RecipeConfigError("actor_rollout_ref.rollout.name is not set: vllm or sglang (verl's rollout engine)")
    if str(config.actor_rollout_ref.rollout.name) == REHEARSAL_ROLLOUT and not rehearsal:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.name={REHEARSAL_ROLLOUT} is the CPU rehearsal's backend: add rehearsal=cpu"
        )

    rollout_n = config.actor_rollout_ref.rollout.get("n", 1)
    if isinstance(rollout_n, bool) or not isinstance(rollout_n, int):
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.n must be an integer (responses per prompt), got {rollout_n!r} "
            f"of type {type(rollout_n).__name__}"
        )
    if estimator in GROUP_ESTIMATORS and rollout_n < 2:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.n={rollout_n}: algorithm.adv_estimator={estimator} compares the responses "
            "of a prompt with each other and needs at least 2 per prompt"
        )


def config_warnings(config: Any) -> list[str]:
    """Settings that run but probably skew a comparison of methods, or a method's own balance; one line each,
    printed once before Ray starts (``validate_recipe_config`` has accepted ``config``)."""
    warnings = []
    algorithm = config.algorithm
    if str(algorithm.adv_estimator) == "codapo":
        codapo = CodapoSettings.from_algorithm_config(algorithm)
        if codapo.resample and codapo.tiling_warning():
            warnings.append(codapo.tiling_warning())
    actor = config.actor_rollout_ref.actor
    loss_mode = str(actor.policy_loss.loss_mode)
    if loss_mode in PER_MICRO_BATCH_MEAN:
        warnings.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} averages over each micro-batch (verl's "
            "torch.mean, not its global batch size): k equal micro-batches per rank make the update k times as large, "
            "and with use_dynamic_bsz=true each row weighs 1 / its micro-batch's size; keep one micro-batch per rank "
            "(use_dynamic_bsz=false, ppo_micro_batch_size_per_gpu = a rank's share of a mini-batch)"
        )
    agent = OmegaConf.select(config, "actor_rollout_ref.rollout.agent", default=None) or {}
    loop = agent.get("default_agent_loop", None) or "single_turn_agent"
    mode = str(config.trainer.get("v1", {}).get("trainer_mode", "sync"))
    if str(algorithm.adv_estimator) == "apo" and not is_recipe_trainer(mode) and (
            loop not in SINGLE_OUTPUT_AGENT_LOOPS or agent.get("agent_loop_config_path", None)):
        warnings.append(
            f"algorithm.adv_estimator=apo with trainer.v1.trainer_mode={mode} and agent loop {loop}: if a loop returns "
            "several outputs per trajectory, verl's trainer hands apo every output as a response of its group (its "
            "final-output rule covers grpo only), so trajectories with more outputs weigh more in the group and "
            "the anchor; the recipe's trainer (trainer.v1.trainer_mode=sync, colocate_async or separate_async) "
            "applies the rule to apo"
        )
    prompts, per_update = config.data.get("train_batch_size"), actor.get("ppo_mini_batch_size")
    if _positive_number(prompts) and _positive_number(per_update) and prompts > per_update and not actor.get("shuffle"):
        warnings.append(
            f"{prompts // per_update} mini-batches per step with actor_rollout_ref.actor.shuffle=false: verl keeps "
            "a step's responses in the order they finished (short first) and cuts mini-batches in sequence, so "
            "later updates get the longer responses; set actor_rollout_ref.actor.shuffle=true (the scripts do)"
        )
    if config.trainer.get("balance_batch", True) is False:
        warnings.append(
            "trainer.balance_batch=false has no effect in verl 0.9.1's V1 trainer: it always balances each step's "
            "batch across the data-parallel ranks by sequence length (trainer_base._balance_batch)"
        )
    return warnings
