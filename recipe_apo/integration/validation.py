"""Checks of a composed training config, run in the launching process before Ray starts.

A wrong setting found here costs a second and one line naming the key; found in a Ray worker it costs a
model load, a rollout and a traceback.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from omegaconf import OmegaConf

from recipe_apo.integration.agpo_launch import agpo_settings, check_agpo_launch
from recipe_apo.integration.engine_watch import EngineWatch
from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.flags import check_flags
from recipe_apo.integration.modes import ASYNC_MODES, is_recipe_trainer, verl_mode
from recipe_apo.integration.verl_settings import check_token_budgets, check_trainer_mode, check_v1_settings
from recipe_apo.methods.apo_settings import ApoConfigError, ApoSettings
from recipe_apo.methods.checks import AGG_MODES, NORM_MODE, check_choice, check_integer, check_number
from recipe_apo.methods.codapo import CodapoConfigError, CodapoSettings
from recipe_apo.methods.zero_variance import check_mode as check_zero_variance
from recipe_apo.plugin import NAME as APO_LOSS
from recipe_apo.plugin import ONE_SIDED

__all__ = [
    "CHECKERS", "GROUP_ESTIMATORS", "HARD_WIRED_ESTIMATORS", "OWN_AGGREGATION", "PER_MICRO_BATCH_MEAN",
    "REHEARSAL_ROLLOUT", "SINGLE_OUTPUT_AGENT_LOOPS", "WARNINGS", "RecipeConfigError", "config_warnings",
    "validate_recipe_config",
]

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
# The CPU rehearsal's rollout backend (recipe_apo/cpu/), registered only when the rehearsal is on.
REHEARSAL_ROLLOUT = "hf"
# How a refusal names the trainers that run the recipe's own driver code.
_RECIPE_TRAINERS = "trainer.v1.trainer_mode=sync, colocate_async or separate_async"


def _estimator(config: Any) -> str:
    return str(config.algorithm.adv_estimator)


def _trainer_mode(config: Any) -> str:
    return str(config.trainer.get("v1", {}).get("trainer_mode", "sync"))


def _apo_settings(config: Any) -> ApoSettings:
    try:
        return ApoSettings.from_algorithm_config(config.algorithm)
    except ApoConfigError as exc:
        raise RecipeConfigError(str(exc)) from None


def _codapo_settings(config: Any) -> CodapoSettings:
    try:
        return CodapoSettings.from_algorithm_config(config.algorithm)
    except CodapoConfigError as exc:
        raise RecipeConfigError(str(exc)) from None


def _is_positive_number(value: Any) -> bool:
    """Whether ``value`` is a finite number > 0 (a batch size a warning may divide by)."""
    try:
        check_number("", value, RecipeConfigError, low=0, low_open=True)
    except RecipeConfigError:
        return False
    return True


# ---- checks, in the order they run (CHECKERS) -----------------------------------------------------------------
def _check_flags(config: Any, rehearsal: bool) -> None:
    """Refuses a flag set to anything but true/false: every later check reads flags with Python's truth."""
    check_flags(config)


def _check_trainer_mode(config: Any, rehearsal: bool) -> None:
    """Refuses a trainer.v1.trainer_mode that verl's trainer registry lacks (verl's modes, the recipe's apo_*
    trainers, a plugin's own): verl looks the name up as it is, in a Ray worker, after the model load
    (``recipe_apo.integration.verl_settings.check_trainer_mode``, shared with the CPU rehearsal's checks)."""
    check_trainer_mode(config)


def _check_method_settings(config: Any, rehearsal: bool) -> None:
    """Refuses unknown or out-of-range keys under algorithm.apo, .codapo and .agpo, before anything reads them."""
    _apo_settings(config)
    _codapo_settings(config)
    agpo_settings(config)


def _check_agpo(config: Any, rehearsal: bool) -> None:
    """Refuses an AGPO run verl's loop cannot host (``recipe_apo.integration.agpo_launch``)."""
    check_agpo_launch(config)


def _check_zero_variance(config: Any, rehearsal: bool) -> None:
    """Refuses a zero_variance mode the launch cannot honour: the testbed's exact, a mode that has no denominator
    to exclude from, and exclude outside the recipe's trainer (only it rescales the advantages)."""
    algorithm = config.algorithm
    zero_variance = algorithm.get("zero_variance", "keep")
    if zero_variance == "exact":
        raise RecipeConfigError(
            "algorithm.zero_variance=exact is the testbed's reference (a per-mini-batch denominator that verl's "
            "actor does not expose): use algorithm.zero_variance=exclude"
        )
    try:
        check_zero_variance(
            zero_variance, str(config.actor_rollout_ref.actor.loss_agg_mode), algorithm.get("use_kl_in_reward", False)
        )
    except ValueError as exc:
        raise RecipeConfigError(str(exc)) from None
    mode = _trainer_mode(config)
    if zero_variance == "exclude" and not is_recipe_trainer(mode):
        raise RecipeConfigError(
            f"algorithm.zero_variance=exclude needs the recipe's trainer ({_RECIPE_TRAINERS}; got {mode}): only the "
            "recipe's trainer rescales the advantages"
        )


def _check_codapo_trainer(config: Any, rehearsal: bool) -> None:
    """Refuses CoDaPO outside the recipe's trainer: only it hands the old policy's log-probs to the estimator."""
    mode = _trainer_mode(config)
    if _estimator(config) != "codapo" or is_recipe_trainer(mode):
        return
    raise RecipeConfigError(
        f"algorithm.adv_estimator=codapo needs the recipe's trainer ({_RECIPE_TRAINERS}; got {mode}): only the "
        "recipe's trainer hands the old policy's log-probs to the estimator"
        + (" and resamples prompts" if _codapo_settings(config).resample else "")
    )


def _check_codapo_resampling(config: Any, rehearsal: bool) -> None:
    """Refuses CoDaPO's resampling beside whatever changes a step's prompts: asynchronous trainers, verl's group
    filter, a generation batch other than the training batch (each breaks the pairs of steps)."""
    if _estimator(config) != "codapo" or not _codapo_settings(config).resample:
        return
    mode = verl_mode(_trainer_mode(config))
    if mode in ASYNC_MODES:
        raise RecipeConfigError(
            f"algorithm.codapo.resample=true with trainer.v1.trainer_mode={mode}: CoDaPO's second "
            "step of a pair trains on prompts kept from the first, but verl's asynchronous trainers draw "
            "prompts ahead of their step (warm-up, refills); set algorithm.codapo.resample=false (the "
            "confidence-difficulty weighting alone) or use trainer.v1.trainer_mode=sync"
        )
    filter_groups = config.algorithm.get("filter_groups", None) or {}
    if filter_groups.get("enable", False):
        raise RecipeConfigError(
            "algorithm.filter_groups.enable=true with algorithm.codapo.resample=true: verl's group filter "
            "refills a step with new loader prompts, which breaks CoDaPO's pairs; set one of them to false"
        )
    gen_batch = config.data.get("gen_batch_size", None)
    if gen_batch not in (None, config.data.train_batch_size):
        raise RecipeConfigError(
            f"data.gen_batch_size={gen_batch} with algorithm.codapo.resample=true: the resampled step builds "
            f"one batch of data.train_batch_size prompts; unset gen_batch_size or set resample=false"
        )


def _check_trainer_version(config: Any, rehearsal: bool) -> None:
    """Refuses trainer.use_v1=false: the recipe plugs into verl's V1 trainer only."""
    if not config.trainer.get("use_v1", True):
        raise RecipeConfigError("trainer.use_v1=false: the recipe runs verl's V1 trainer; set trainer.use_v1=true")


def _check_v1_settings(config: Any, rehearsal: bool) -> None:
    """Refuses a trainer.v1.* setting of the wrong type or range for the trainer's mode (parameter_sync_step,
    num_warmup_batches, separate_async's hybrid_rollout, the replay buffer's sampler): verl reads each in a Ray
    worker, where a wrong one is a TypeError or an assertion minutes in, and a huge warm-up queues prompts it never
    trains (``recipe_apo.integration.verl_settings.check_v1_settings`` says what each must be, and why)."""
    check_v1_settings(config, check_trainer_mode(config))


def _check_cluster_size(config: Any, rehearsal: bool) -> None:
    """Refuses a trainer.nnodes or trainer.n_gpus_per_node that is not a whole number >= 1: verl multiplies them
    into its resource pool and its batch-size checks, where 1.5 or text fails in a traceback."""
    for key in ("nnodes", "n_gpus_per_node"):
        check_integer(f"trainer.{key}", config.trainer.get(key, 1), RecipeConfigError, low=1)


def _check_token_budgets(config: Any, rehearsal: bool) -> None:
    """Refuses, with dynamic batch sizes, a per-GPU token budget (actor, old log-probs, reference, critic) below
    data.max_prompt_length + data.max_response_length: verl asserts that the longest sequence fits a micro-batch
    in a Ray worker, at the first batch (``recipe_apo.integration.verl_settings.check_token_budgets``)."""
    check_token_budgets(config)


def _check_codapo_rewards(config: Any, rehearsal: bool) -> None:
    """Refuses CoDaPO with algorithm.use_kl_in_reward=true: CoDaPO counts a response as correct when its reward
    is exactly 1.0 (``recipe_apo.methods.codapo``), and a KL-penalised reward (score - beta * KL) never is, so every
    group's accuracy would be 0 and its confidence-difficulty weight the bare offset."""
    if _estimator(config) != "codapo" or not config.algorithm.get("use_kl_in_reward", False):
        return
    raise RecipeConfigError(
        "algorithm.use_kl_in_reward=true with algorithm.adv_estimator=codapo: CoDaPO counts a response as correct "
        "when its reward is exactly 1.0, which a KL-penalised reward never is, so every group's accuracy would be 0 "
        "(weight = the bare weight_offset); use the KL loss instead (actor_rollout_ref.actor.use_kl_loss=true, "
        "algorithm.use_kl_in_reward=false)"
    )


def _check_apo_needs(config: Any, rehearsal: bool) -> None:
    """Refuses APO settings whose inputs the run does not provide: KL-penalised rewards for a success rule that
    needs rewards in [0, 1], data-source anchors without the recipe's trainer (only it hands data sources over)."""
    if _estimator(config) != "apo":
        return
    settings = _apo_settings(config)
    if config.algorithm.get("use_kl_in_reward", False) and settings.success != "threshold":
        # The summed token rewards then carry -beta * KL and leave [0, 1]: the first step would stop.
        raise RecipeConfigError(
            f"algorithm.use_kl_in_reward=true with algorithm.apo.success={settings.success}: KL-penalised "
            "rewards leave the success range; use algorithm.apo.success=threshold or the KL loss "
            "(actor_rollout_ref.actor.use_kl_loss=true)"
        )
    mode = _trainer_mode(config)
    if settings.anchor_scope == "data_source" and not is_recipe_trainer(mode):
        raise RecipeConfigError(
            f"algorithm.apo.anchor_scope=data_source needs the recipe's trainer ({_RECIPE_TRAINERS}; got {mode}): "
            "only the recipe's trainer hands data sources to the estimator"
        )


def _check_registered_names(config: Any, rehearsal: bool) -> None:
    """Refuses an estimator or a policy loss that verl would not find: a typo fails here, not in a Ray worker."""
    from verl.trainer.ppo import core_algos

    import recipe_apo  # noqa: F401  (registers apo in this process even with VERL_USE_EXTERNAL_PLUGINS=none)

    estimator = _estimator(config)
    if estimator not in HARD_WIRED_ESTIMATORS and estimator not in core_algos.ADV_ESTIMATOR_REGISTRY:
        known = ", ".join(sorted(set(core_algos.ADV_ESTIMATOR_REGISTRY) | set(HARD_WIRED_ESTIMATORS)))
        raise RecipeConfigError(f"algorithm.adv_estimator={estimator} is not a registered estimator; known: {known}")
    loss_mode = str(config.actor_rollout_ref.actor.policy_loss.loss_mode)
    if loss_mode not in core_algos.POLICY_LOSS_REGISTRY:
        known = ", ".join(sorted(core_algos.POLICY_LOSS_REGISTRY))
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} is not a registered policy loss; known: {known}"
        )


def _check_std_normalisation(config: Any, rehearsal: bool) -> None:
    """Refuses a norm_adv_by_std_in_grpo the estimator does not read: verl would accept it and do the other thing."""
    estimator = _estimator(config)
    norm_by_std = bool(config.algorithm.get("norm_adv_by_std_in_grpo", True))
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


def _check_own_aggregation(config: Any, rehearsal: bool) -> None:
    """Refuses a loss_agg_mode that the policy loss ignores (OWN_AGGREGATION): the run would aggregate otherwise."""
    actor = config.actor_rollout_ref.actor
    loss_mode, agg_mode = str(actor.policy_loss.loss_mode), str(actor.loss_agg_mode)
    if loss_mode in OWN_AGGREGATION and agg_mode != OWN_AGGREGATION[loss_mode]:
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} ignores loss_agg_mode={agg_mode}: verl's "
            f"{loss_mode} always aggregates with {OWN_AGGREGATION[loss_mode]}; set that"
            + _OWN_AGGREGATION_ALTERNATIVE.get(loss_mode, "")
        )


def _check_aggregation(config: Any, rehearsal: bool) -> None:
    """Refuses an unknown loss_agg_mode and an L0 (loss_scale_factor) that its mode ignores, lacks, or that is not
    a number > 0: the L0 divides every sequence's summed loss."""
    actor = config.actor_rollout_ref.actor
    agg_mode, scale = str(actor.loss_agg_mode), actor.get("loss_scale_factor", None)
    if scale is not None and agg_mode != NORM_MODE:
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.loss_scale_factor={scale} is only read with "
            f"loss_agg_mode={NORM_MODE} (got {agg_mode}): set it to null, or use that mode for a constant L0"
        )
    check_choice("actor_rollout_ref.actor.loss_agg_mode", agg_mode, AGG_MODES, RecipeConfigError)
    if agg_mode == NORM_MODE and scale is None:
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.loss_scale_factor (L0) must be set with loss_agg_mode={NORM_MODE}: "
            "set it to data.max_response_length"
        )
    if scale is not None:
        check_number("actor_rollout_ref.actor.loss_scale_factor", scale, RecipeConfigError, low=0, low_open=True)


def _check_apo_clips(config: Any, rehearsal: bool) -> None:
    """Refuses APO's losses (the gate and its one-sided form) without temperatures > 0 (tau_pos, tau_neg): the gate
    divides by them."""
    actor = config.actor_rollout_ref.actor
    if str(actor.policy_loss.loss_mode) not in (APO_LOSS, ONE_SIDED):
        return
    for key in ("tau_pos", "tau_neg"):
        check_number(f"actor_rollout_ref.actor.{key}", actor.get(key), RecipeConfigError, low=0, low_open=True)


def _check_rollout_name(config: Any, rehearsal: bool) -> None:
    """Refuses an unset rollout engine, and the CPU rehearsal's engine without rehearsal=cpu (which registers it)."""
    rollout = config.actor_rollout_ref.rollout
    if OmegaConf.is_missing(rollout, "name"):
        raise RecipeConfigError("actor_rollout_ref.rollout.name is not set: vllm or sglang (verl's rollout engine)")
    if str(rollout.name) == REHEARSAL_ROLLOUT and not rehearsal:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.name={REHEARSAL_ROLLOUT} is the CPU rehearsal's backend: add rehearsal=cpu"
        )


def _check_rollout_watch(config: Any, rehearsal: bool) -> None:
    """Refuses a rollout_watch setting that is not a positive number of seconds (the driver's watch on the engines)."""
    EngineWatch.from_config(config)


def _check_group_size(config: Any, rehearsal: bool) -> None:
    """Refuses a rollout.n that is not a whole number, or below 2 for a group estimator (GROUP_ESTIMATORS): a group
    of one response has nothing to compare it with."""
    rollout_n = check_integer("actor_rollout_ref.rollout.n", config.actor_rollout_ref.rollout.get("n", 1),
                              RecipeConfigError)
    estimator = _estimator(config)
    if estimator in GROUP_ESTIMATORS and rollout_n < 2:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.n={rollout_n}: algorithm.adv_estimator={estimator} compares the responses "
            "of a prompt with each other and needs at least 2 per prompt"
        )


# Run in this order by validate_recipe_config; the first refusal stops the launch. Each takes the resolved config
# and whether the job runs the CPU rehearsal.
CHECKERS: tuple[Callable[[Any, bool], None], ...] = (
    _check_flags,
    _check_trainer_mode,
    _check_method_settings,
    _check_zero_variance,
    _check_codapo_trainer,
    _check_codapo_resampling,
    _check_trainer_version,
    _check_v1_settings,
    _check_cluster_size,
    _check_token_budgets,
    _check_codapo_rewards,
    _check_apo_needs,
    _check_registered_names,
    _check_std_normalisation,
    _check_own_aggregation,
    _check_aggregation,
    _check_apo_clips,
    _check_agpo,
    _check_rollout_name,
    _check_rollout_watch,
    _check_group_size,
)


def validate_recipe_config(config: Any, rehearsal: bool = False) -> None:
    """Raise ``RecipeConfigError`` for the first invalid setting of a resolved trainer config.

    ``rehearsal``: the job runs the CPU rehearsal (``rehearsal=cpu``), whose own checks ran already.
    """
    for check in CHECKERS:
        check(config, rehearsal)


# ---- warnings, in the order they are printed (WARNINGS) ---------------------------------------------------------
def _warn_codapo_tiling(config: Any) -> Optional[str]:
    """A resampling CoDaPO whose repeat_count does not tile the batch: kept prompts are sampled unevenly."""
    if str(config.algorithm.adv_estimator) != "codapo":
        return None
    codapo = CodapoSettings.from_algorithm_config(config.algorithm)
    return codapo.tiling_warning() if codapo.resample else None


def _warn_per_micro_batch_mean(config: Any) -> Optional[str]:
    """A policy loss that averages per micro-batch (PER_MICRO_BATCH_MEAN): the update grows with their count."""
    loss_mode = str(config.actor_rollout_ref.actor.policy_loss.loss_mode)
    if loss_mode not in PER_MICRO_BATCH_MEAN:
        return None
    return (
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} averages over each micro-batch (verl's "
        "torch.mean, not its global batch size): k equal micro-batches per rank make the update k times as large, "
        "and with use_dynamic_bsz=true each row weighs 1 / its micro-batch's size; keep one micro-batch per rank "
        "(use_dynamic_bsz=false, ppo_micro_batch_size_per_gpu = a rank's share of a mini-batch)"
    )


def _warn_multi_output_loops(config: Any) -> Optional[str]:
    """APO in verl's trainer with an agent loop that may return several outputs per trajectory: those weigh more."""
    agent = OmegaConf.select(config, "actor_rollout_ref.rollout.agent", default=None) or {}
    loop = agent.get("default_agent_loop", None) or "single_turn_agent"
    mode = _trainer_mode(config)
    if str(config.algorithm.adv_estimator) != "apo" or is_recipe_trainer(mode) or (
            loop in SINGLE_OUTPUT_AGENT_LOOPS and not agent.get("agent_loop_config_path", None)):
        return None
    return (
        f"algorithm.adv_estimator=apo with trainer.v1.trainer_mode={mode} and agent loop {loop}: if a loop returns "
        "several outputs per trajectory, verl's trainer hands apo every output as a response of its group (its "
        "final-output rule covers grpo only), so trajectories with more outputs weigh more in the group and "
        "the anchor; the recipe's trainer (trainer.v1.trainer_mode=sync, colocate_async or separate_async) "
        "applies the rule to apo"
    )


def _warn_unshuffled_mini_batches(config: Any) -> Optional[str]:
    """Several mini-batches per step without shuffling: later updates get the longer responses."""
    actor = config.actor_rollout_ref.actor
    prompts, per_update = config.data.get("train_batch_size"), actor.get("ppo_mini_batch_size")
    if not (_is_positive_number(prompts) and _is_positive_number(per_update) and prompts > per_update
            and not actor.get("shuffle")):
        return None
    return (
        f"{prompts // per_update} mini-batches per step with actor_rollout_ref.actor.shuffle=false: verl keeps "
        "a step's responses in the order they finished (short first) and cuts mini-batches in sequence, so "
        "later updates get the longer responses; set actor_rollout_ref.actor.shuffle=true (the scripts do)"
    )


def _warn_unbalanced_batch(config: Any) -> Optional[str]:
    """trainer.balance_batch=false, which verl's V1 trainer does not read: it always balances."""
    if config.trainer.get("balance_batch", True) is not False:
        return None
    return (
        "trainer.balance_batch=false has no effect in verl 0.9.1's V1 trainer: it always balances each step's "
        "batch across the data-parallel ranks by sequence length (trainer_base._balance_batch)"
    )


def _warn_codapo_overlong_penalty(config: Any) -> Optional[str]:
    """CoDaPO beside DAPO's overlong penalty (verl's dapo reward manager): a correct but long response scores below
    1.0, and CoDaPO's accuracy counts only rewards exactly 1.0 (the same trap as the KL penalty, for long ones)."""
    manager = OmegaConf.select(config, "reward.reward_manager.name", default=None)
    overlong = OmegaConf.select(config, "reward.reward_kwargs.overlong_buffer_cfg.enable", default=None)
    if str(config.algorithm.adv_estimator) != "codapo" or manager != "dapo" or overlong is not True:
        return None
    return (
        "algorithm.adv_estimator=codapo with reward.reward_manager.name=dapo and "
        "reward.reward_kwargs.overlong_buffer_cfg.enable=true: DAPO's overlong penalty lowers the reward of responses "
        "longer than max_resp_len - overlong_buffer_cfg.len, so a correct long one scores below 1.0 and CoDaPO's "
        "accuracy (rewards exactly 1.0) counts it as wrong"
    )


# Run in this order by config_warnings; each returns its one line, or None when the setting is fine.
WARNINGS: tuple[Callable[[Any], Optional[str]], ...] = (
    _warn_codapo_tiling,
    _warn_codapo_overlong_penalty,
    _warn_per_micro_batch_mean,
    _warn_multi_output_loops,
    _warn_unshuffled_mini_batches,
    _warn_unbalanced_batch,
)


def config_warnings(config: Any) -> list[str]:
    """Settings that run but probably skew a comparison of methods, or a method's own balance; one line each,
    printed once before Ray starts (``validate_recipe_config`` has accepted ``config``)."""
    return [line for line in (warn(config) for warn in WARNINGS) if line]
