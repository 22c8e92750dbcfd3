"""Checks of a composed training config, run in the launching process before Ray starts.

A wrong setting found here costs a second and one line naming the key; found in a Ray worker it costs a
model load, a rollout and a traceback.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from omegaconf import OmegaConf, open_dict

from recipe_apo.integration.engine_watch import EngineWatch
from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.flags import check_flags
from recipe_apo.integration.modes import is_recipe_trainer, verl_mode
from recipe_apo.integration.refill_cap import RefillCap
from recipe_apo.integration.sampling import AGENT_LOOPS
from recipe_apo.integration.sampling import NAME as SAMPLING_LOOP
from recipe_apo.integration.sampling import TARGET as SAMPLING_TARGET
from recipe_apo.integration.verl_settings import check_token_budgets, check_trainer_mode, check_v1_settings
from recipe_apo.methods import catalog
from recipe_apo.methods.base import Launch
from recipe_apo.methods.checks import (
    AGG_MODES,
    L0_BOUNDS,
    NORM_MODE,
    OWN_AGGREGATION,
    check_choice,
    check_flag,
    check_integer,
    check_loss_settings,
    check_number,
)
from recipe_apo.methods.errors import MethodConfigError

__all__ = [
    "CHECKERS", "GROUP_ESTIMATORS", "HARD_WIRED_ESTIMATORS", "OWN_AGGREGATION", "PER_MICRO_BATCH_MEAN",
    "REHEARSAL_ROLLOUT", "WARNINGS", "RecipeConfigError", "config_warnings", "launch_of", "route_agent_loops",
    "validate_recipe_config",
]

# Estimators that compare the responses of one prompt with each other: a group of one carries no signal.
GROUP_ESTIMATORS = ("grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "grpo_passk", "opo", "gdpo",
                    *catalog.estimators())
# What else to do, after "set that", when loss_agg_mode disagrees.
_OWN_AGGREGATION_ALTERNATIVE = {"sapo": ", or use loss_mode=apo (same gate, any mode)"}
# Policy losses of verl 0.9.1 that average over each micro-batch and ignore verl's global batch size: k micro-batches
# per rank give k times the update (tests/e2e/test_gradient_invariance.py measures it).
PER_MICRO_BATCH_MEAN = ("geo_mean",)
# verl's driver calls these two without looking them up in the registry.
HARD_WIRED_ESTIMATORS = ("gae", "grpo")
# The CPU rehearsal's rollout backend (recipe_apo/cpu/), registered only when the rehearsal is on.
REHEARSAL_ROLLOUT = "hf"


def _estimator(config: Any) -> str:
    return str(config.algorithm.adv_estimator)


def _trainer_mode(config: Any) -> str:
    return str(config.trainer.get("v1", {}).get("trainer_mode", "sync"))


def launch_of(config: Any, rehearsal: bool = False) -> Launch:
    """What a method's launch checks get: the config, and what the launch knows of its trainer."""
    mode = _trainer_mode(config)
    return Launch(config, recipe_trainer=is_recipe_trainer(mode), verl_mode=verl_mode(mode), rehearsal=rehearsal)


def _is_positive_number(value: Any) -> bool:
    """Whether ``value`` is a finite number > 0 (a batch size a warning may divide by)."""
    try:
        check_number("", value, RecipeConfigError, low=0, low_open=True)
    except RecipeConfigError:
        return False
    return True


def _said(check) -> None:
    """Run a method's check; its refusal is the launch's (``RecipeConfigError``, the same line)."""
    try:
        check()
    except MethodConfigError as exc:
        raise RecipeConfigError(str(exc)) from None


def route_agent_loops(config: Any) -> None:
    """A run with a method that samples each prompt at its own settings (``Method.prompt_columns``), without an
    agent loop file of its own, gets the recipe's (which registers ``recipe_sampling``)."""
    if not any(m.prompt_columns for m in catalog.active(config)):
        return
    agent = config.actor_rollout_ref.rollout.agent
    if agent.get("agent_loop_config_path") is None:
        with open_dict(config):
            agent.agent_loop_config_path = AGENT_LOOPS


def _lists_sampling_loop(path: str) -> bool:
    try:
        entries = OmegaConf.load(path)
    except Exception as exc:
        raise RecipeConfigError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path} cannot be read "
                                f"({type(exc).__name__}: {exc})") from None
    return OmegaConf.is_list(entries) and any(
        OmegaConf.is_dict(e) and e.get("name") == SAMPLING_LOOP and e.get("_target_") == SAMPLING_TARGET
        for e in entries)


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
    """Refuses unknown or out-of-range keys under every method's settings node (``algorithm.apo``, ...), before
    anything reads them."""
    for method in catalog.methods():
        _said(lambda: method.read_settings(config.algorithm))


def _check_methods(config: Any, rehearsal: bool) -> None:
    """Every method's own launch checks (``@METHOD.launch_check``, in catalog order), each on what it reads."""
    launch = launch_of(config, rehearsal)
    for method in catalog.methods():
        for check in method.checks():
            _said(lambda: check(launch))


def _check_sampling_loop(config: Any, rehearsal: bool) -> None:
    """Refuses a run whose methods sample each prompt at its own settings without the ``recipe_sampling`` agent
    loop in its agent loop file (``route_agent_loops`` sets the recipe's when the run names none)."""
    wanting = [m for m in catalog.active(config) if m.prompt_columns]
    if not wanting:
        return
    path = config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
    if path is None or not _lists_sampling_loop(str(path)):
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path} does not register the agent loop "
            f"{SAMPLING_LOOP} that {wanting[0].presets[0] if wanting[0].presets else wanting[0].name} samples "
            f"through: add the entry of {AGENT_LOOPS} to it")


PLAIN_VERL = "python -m verl.trainer.main_ppo trainer.use_v1=false algorithm.adv_estimator=apo ... (docs/plain_verl.md)"


def _check_trainer_version(config: Any, rehearsal: bool) -> None:
    """Refuses trainer.use_v1=false (the recipe plugs into verl's V1 trainer only), and a verl without the V1 task
    runner the recipe's entry builds on (verl's ``neo`` branch deletes ``TaskRunnerV1``): one line naming verl's
    version and the plain-verl command, where the registered estimators and losses still work."""
    if not config.trainer.get("use_v1", True):
        raise RecipeConfigError("trainer.use_v1=false: the recipe runs verl's V1 trainer; set trainer.use_v1=true")
    import importlib

    import verl

    if not hasattr(importlib.import_module("verl.trainer.main_ppo"), "TaskRunnerV1"):
        raise RecipeConfigError(
            f"verl {getattr(verl, '__version__', '(unknown version)')} has no verl.trainer.main_ppo.TaskRunnerV1, "
            f"which `python -m recipe_apo.main` runs on (the recipe pins verl 0.9.1); with this verl use its own "
            f"entry, where the plugin's estimators and losses are registered: {PLAIN_VERL}")


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


def _check_registered_names(config: Any, rehearsal: bool) -> None:
    """Refuses an estimator or a policy loss that verl would not find: a typo fails here, not in a Ray worker."""
    from verl.trainer.ppo import core_algos

    from recipe_apo import plugin  # registers the recipe's estimators and losses

    estimator = _estimator(config)
    loss_mode = str(config.actor_rollout_ref.actor.policy_loss.loss_mode)
    for kind, key, name in (("advantage estimator", "algorithm.adv_estimator", estimator),
                            ("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode", loss_mode)):
        taken = plugin.taken_message(kind, key, name)
        if taken is not None:
            raise RecipeConfigError(taken)
    if estimator not in HARD_WIRED_ESTIMATORS and estimator not in core_algos.ADV_ESTIMATOR_REGISTRY:
        known = ", ".join(sorted(set(core_algos.ADV_ESTIMATOR_REGISTRY) | set(HARD_WIRED_ESTIMATORS)))
        raise RecipeConfigError(f"algorithm.adv_estimator={estimator} is not a registered estimator; known: {known}")
    if loss_mode not in core_algos.POLICY_LOSS_REGISTRY:
        known = ", ".join(sorted(core_algos.POLICY_LOSS_REGISTRY))
        raise RecipeConfigError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} is not a registered policy loss; known: {known}"
        )


def _check_std_normalisation(config: Any, rehearsal: bool) -> None:
    """Refuses a norm_adv_by_std_in_grpo that verl's estimator ignores: verl would accept it and do the other thing
    (a method's own estimator says the same for itself, in its launch checks)."""
    if _estimator(config) == "grpo_vectorized" and not bool(config.algorithm.get("norm_adv_by_std_in_grpo", True)):
        raise RecipeConfigError(
            "algorithm.adv_estimator=grpo_vectorized ignores algorithm.norm_adv_by_std_in_grpo=false in verl 0.9.1 "
            "(it always divides by the std): use algorithm.adv_estimator=grpo for Dr. GRPO's centered advantages"
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
        check_number("actor_rollout_ref.actor.loss_scale_factor", scale, RecipeConfigError, low=L0_BOUNDS[0],
                     high=L0_BOUNDS[1])


def _targets(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(the node's dotted key, its ``_target_``) of every node of a config (a plain container) that has one."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield path, node["_target_"]
        for key, value in node.items():
            yield from _targets(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets(value, f"{path}[{i}]")


def _check_config_classes(config: Any, rehearsal: bool) -> None:
    """Refuses a ``_target_`` that is not one of verl's config dataclasses. verl's config check, which the launch
    runs (a dry run too: ``verl_settings.check_with_verl``), builds a node with a ``_target_`` as the object it names
    (``verl.utils.config.omega_conf_to_dataclass``, through Hydra's instantiate): a ``_target_`` of anything else
    would be called with the node's keys before Ray starts. Only ``verl.*`` names are imported, to find the class."""
    import dataclasses
    import importlib

    for path, target in _targets(OmegaConf.to_container(config, resolve=False)):
        module_name, _, name = str(target).rpartition(".")
        found = None
        if isinstance(target, str) and module_name.split(".")[0] == "verl":
            try:
                found = getattr(importlib.import_module(module_name), name)
            except Exception:  # a name verl does not have: refused below as any other
                found = None
        if not (isinstance(found, type) and dataclasses.is_dataclass(found)):
            raise RecipeConfigError(
                f"{path}._target_={target}: verl builds this node as the object its _target_ names when the launch "
                "checks the config (a dry run too), so it must be one of verl's config classes (a dataclass of "
                "verl.*), as verl's own config sets it")


def _check_loss_settings(config: Any, rehearsal: bool) -> None:
    """Refuses verl's loss settings out of their bounds, for every method (``methods.checks.check_loss_settings``):
    a NaN or inverted clip range and a NaN or negative kl_loss_coef train without a word, and clip_ratio_c <= 1 is
    verl's assertion in the actor, after Ray and the model load."""
    check_loss_settings(config.actor_rollout_ref.actor, RecipeConfigError)


def _listed_loops(path: str) -> set[str]:
    """The names an agent loop file registers (verl reads it in each agent loop worker, resolved as here)."""
    from verl.utils.import_utils import resolve_config_path

    try:
        entries = OmegaConf.load(resolve_config_path(path))
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise RecipeConfigError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path} cannot be read "
                                f"({type(exc).__name__}: {first})") from None
    if not OmegaConf.is_list(entries):
        raise RecipeConfigError(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path} is not a list of "
                                "agent loops (- name: ..., _target_: ...)")
    return {str(e.get("name")) for e in entries if OmegaConf.is_dict(e) and e.get("name") is not None}


def _check_agent_loop(config: Any, rehearsal: bool) -> None:
    """Refuses a rollout.agent.default_agent_loop that no agent loop registers: verl's own (its registry, filled
    as verl's agent loop package is imported) or one the run's agent_loop_config_path lists (the recipe's
    agent_loops.yaml for a method that samples prompts at their own settings, the rehearsal's, a user's own).
    verl looks the name up per prompt, in a Ray worker, after the model load and the engines' start. The recipe's
    own recipe_sampling is refused too: it wraps the loop a prompt names, default_agent_loop when it names none."""
    agent = OmegaConf.select(config, "actor_rollout_ref.rollout.agent", default=None) or {}
    loop = agent.get("default_agent_loop", "single_turn_agent")
    key = "actor_rollout_ref.rollout.agent.default_agent_loop"
    if loop == SAMPLING_LOOP:
        raise RecipeConfigError(f"{key}={loop}: the recipe's {SAMPLING_LOOP} runs the loop each prompt names, this "
                                "one when it names none; name a loop that generates (single_turn_agent, ...)")
    path = agent.get("agent_loop_config_path", None)
    listed = _listed_loops(str(path)) if path else set()
    if isinstance(loop, str) and loop in listed:
        return
    from recipe_apo.integration.verl_worker_access import registered_agent_loops

    registered = registered_agent_loops()
    if isinstance(loop, str) and loop in registered:
        return
    known = ", ".join(sorted((set(registered) | listed) - {SAMPLING_LOOP}))
    raise RecipeConfigError(f"{key}={loop} is not a registered agent loop; known: {known} (a loop of your own: list "
                            "it in actor_rollout_ref.rollout.agent.agent_loop_config_path)")


# The checkpoint settings verl 0.9.1 cannot honour, and why. With the actor's async_save its V1 trainer skips writing
# the tracker (trainer_base._save_checkpoint: "skip write latest_checkpointed_iteration.txt when async_save is True")
# and nothing writes it later; no worker of verl 0.9.1 defines async_calls_finalize_fn_exec, which would finish
# Megatron's asynchronous writes (FSDP ignores the setting and saves synchronously).
ASYNC_SAVE = {
    "actor_rollout_ref.actor.checkpoint.async_save": (
        "verl 0.9.1's trainer then never writes latest_checkpointed_iteration.txt (it skips it for an asynchronous "
        "save, and nothing finishes one), so a resume starts again from step 0 without a word (verl issue #7952)"),
    "critic.checkpoint.async_save": (
        "verl 0.9.1's trainer never finishes an asynchronous save (no worker defines async_calls_finalize_fn_exec), "
        "so Megatron's critic checkpoint may never be complete"),
}


def _check_async_save(config: Any, rehearsal: bool) -> None:
    """Refuses checkpoint.async_save=true (ASYNC_SAVE says why for each key), or a value that is not a boolean
    (verl tests it with ``if``: 'false' is true); FSDP saves synchronously either way. ``trainer.async_save``, the
    name verl's issue gives it, is no setting of verl 0.9.1: added with ``+``, it would be dropped without a word."""
    if OmegaConf.select(config, "trainer.async_save", default=None) is not None:
        raise RecipeConfigError(
            f"trainer.async_save={OmegaConf.select(config, 'trainer.async_save')} is not a setting of verl 0.9.1, "
            "which would ignore it; its asynchronous save is actor_rollout_ref.actor.checkpoint.async_save, which "
            "the launch refuses (no resume tracker is written: verl issue #7952); drop it")
    for key, why in ASYNC_SAVE.items():
        value = OmegaConf.select(config, key, default=False)
        if value is not None and check_flag(key, value, RecipeConfigError):
            raise RecipeConfigError(f"{key}=true: {why}; set it to false (FSDP saves synchronously either way)")


def _check_rollout_name(config: Any, rehearsal: bool) -> None:
    """Refuses an unset rollout engine, and the CPU rehearsal's engine without rehearsal=cpu (which registers it)."""
    rollout = config.actor_rollout_ref.rollout
    if OmegaConf.is_missing(rollout, "name"):
        raise RecipeConfigError("actor_rollout_ref.rollout.name is not set: vllm or sglang (verl's rollout engine)")
    if str(rollout.name) == REHEARSAL_ROLLOUT and not rehearsal:
        raise RecipeConfigError(
            f"actor_rollout_ref.rollout.name={REHEARSAL_ROLLOUT} is the CPU rehearsal's backend: add rehearsal=cpu"
        )


# torch's, numpy's and vLLM's seeding all take a whole number in [0, 2^32 - 1].
SEED_MAX = 2**32 - 1


def _check_data_seed(config: Any, rehearsal: bool) -> None:
    check_data_seed(config)


def check_data_seed(config: Any) -> None:
    """Refuses a data.seed that is not null or a whole number in [0, 2^32 - 1]: verl hands it to torch's
    ``manual_seed`` only inside a Ray worker, after the cluster and the model have started (``01`` and ``abc`` are
    strings to Hydra, ``1.5`` a float, ``2^70`` overflows the seeding)."""
    seed = config.data.get("seed", None)
    if seed is None:
        return
    hint = " (a string: Hydra reads 01 as '01'; write 1)" if isinstance(seed, str) and seed.strip().isdigit() else ""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise RecipeConfigError(f"data.seed={seed!r}: null or a whole number in [0, {SEED_MAX}]{hint}")


def _check_rollout_watch(config: Any, rehearsal: bool) -> None:
    """Refuses a rollout_watch setting that is not a positive number of seconds (the driver's watch on the engines)."""
    EngineWatch.from_config(config)


def _check_refill_cap(config: Any, rehearsal: bool) -> None:
    """Refuses a group filter's max_num_gen_batches that is not a whole number (the recipe's trainer caps the
    filter's refills with it: ``recipe_apo.integration.refill_cap``)."""
    RefillCap.from_config(config)


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
    _check_config_classes,
    _check_trainer_mode,
    _check_method_settings,
    _check_loss_settings,
    _check_async_save,
    _check_methods,
    _check_trainer_version,
    _check_v1_settings,
    _check_cluster_size,
    _check_token_budgets,
    _check_registered_names,
    _check_std_normalisation,
    _check_own_aggregation,
    _check_aggregation,
    _check_sampling_loop,
    _check_agent_loop,
    _check_rollout_name,
    _check_rollout_watch,
    _check_refill_cap,
    _check_group_size,
    _check_data_seed,
)


def check_preset_runs(config: Any, preset: Optional[str]) -> None:
    """Refuses a run whose command line turns off a method its preset (``method=<preset>``) is named for: the run
    would go on under the preset's name without it (``method=agpo_dual`` with another ``loss_mode``)."""
    if preset is None:
        return
    actor = config.actor_rollout_ref.actor
    for method in catalog.of_preset(str(preset)):
        if not method.active(config):
            raise RecipeConfigError(
                f"method={preset} with algorithm.adv_estimator={config.algorithm.adv_estimator} and "
                f"actor_rollout_ref.actor.policy_loss.loss_mode={actor.policy_loss.loss_mode}: these settings turn "
                f"{method.title} off, and the run would still be named {preset}; drop the override, or choose the "
                "preset of what you run")


def validate_recipe_config(config: Any, rehearsal: bool = False) -> None:
    """Raise ``RecipeConfigError`` for the first invalid setting of a resolved trainer config.

    ``rehearsal``: the job runs the CPU rehearsal (``rehearsal=cpu``), whose own checks ran already.
    """
    for check in CHECKERS:
        check(config, rehearsal)


# ---- warnings, in the order they are printed (WARNINGS) ---------------------------------------------------------
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


# Run in this order by config_warnings, after every method's own; each returns its one line, or None.
WARNINGS: tuple[Callable[[Any], Optional[str]], ...] = (
    _warn_per_micro_batch_mean,
    _warn_unshuffled_mini_batches,
    _warn_unbalanced_batch,
)


def config_warnings(config: Any, rehearsal: bool = False) -> list[str]:
    """Settings that run but probably skew a comparison of methods, or a method's own balance; one line each,
    printed once before Ray starts (``validate_recipe_config`` has accepted ``config``): every method's own
    (``@METHOD.launch_warning``, in catalog order), then the launch's."""
    launch = launch_of(config, rehearsal)
    lines = [warn(launch) for method in catalog.methods() for warn in method.warnings()]
    return [line for line in (*lines, *(warn(config) for warn in WARNINGS)) if line]
