"""verl's own settings that its Ray workers read minutes into a run, checked in the launching process against
verl's definitions: the V1 trainer's mode and its ``trainer.v1.*`` settings, and the token budgets of dynamic
batch sizes. ``recipe_apo.integration.validation`` runs these checks, and the CPU rehearsal's own checks share
the trainer-mode one (they run first).

Each refusal is one line naming the key, the value and what verl allows; verl itself says it with a traceback
from inside Ray (an assertion, a TypeError, or "Unknown trainer" after the model load). The file:line notes are
verl 0.9.1's.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import sys
import typing
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import DictConfig

from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.integration.modes import ASYNC_MODES, RECIPE_TRAINERS, verl_mode
from recipe_apo.methods.checks import check_choice, check_flag, check_integer, check_number

__all__ = [
    "MAX_OFF_POLICY_STRATEGIES", "MODE_KEY", "SEQUENCE_PARALLEL_KEYS", "check_token_budgets", "check_trainer_mode",
    "check_with_verl",
    "check_v1_settings", "registered_trainers", "verl_trainer_names",
]

MODE_KEY = "trainer.v1.trainer_mode"
# verl's replay buffer: replay_buffer.py:175 asserts the strategy is one of these.
MAX_OFF_POLICY_STRATEGIES = ("drop", "wait")
# Where each training engine takes the sequence-parallel size that multiplies a per-GPU token budget
# (workers/engine/utils.py:111, max_token_len = max_token_len_per_gpu * sp_size): FSDP's Ulysses size (actor
# and ref: ulysses_sequence_parallel_size, copied into fsdp_config when > 1, workers/config/actor.py:328; the
# critic's engine config is ``fsdp``), Megatron's context parallel size (megatron/transformer_impl.py:836),
# VeOmni's Ulysses size (veomni/transformer_impl.py:417), TorchTitan's tensor parallel size
# (torchtitan/transformer_impl.py:362). The check multiplies by the largest one set: it refuses only budgets
# that no engine of the role could make fit.
SEQUENCE_PARALLEL_KEYS = (
    "ulysses_sequence_parallel_size", "fsdp_config.ulysses_sequence_parallel_size",
    "fsdp.ulysses_sequence_parallel_size", "megatron.context_parallel_size", "veomni.ulysses_parallel_size",
    "torchtitan.tensor_parallel_size",
)


def _get(node: Any, dotted: str, default: Any = None) -> Any:
    """``node.a.b`` or ``default`` when a level is missing or not a mapping (the launch resolves the config
    first; an interpolation left in resolves as it is read)."""
    for part in dotted.split("."):
        if not isinstance(node, (Mapping, DictConfig)) or part not in node:
            return default
        node = node[part]
    return node


def _shown(value: Any) -> str:
    """A value as the refusal writes it after ``key=``: plain words as they are, anything else (a number, null,
    text with spaces) as Python's repr, so that ``' sync'`` shows its space."""
    if isinstance(value, str) and value and value.strip() == value and " " not in value:
        return value
    return "null" if value is None else repr(value)


def _positive_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# ---- trainer.v1.trainer_mode ------------------------------------------------------------------------------------
V1_PACKAGE = "verl.trainer.ppo.v1"
V1_REGISTRY_MODULE = "verl.trainer.ppo.v1.trainer_base"


@functools.lru_cache(maxsize=None)
def verl_trainer_names() -> tuple[str, ...]:
    """The names verl's V1 package registers, read off its ``@register_trainer("...")`` decorators
    (trainer_sync.py:24, trainer_colocate_async.py:19, trainer_separate_async.py:44) without importing it:
    importing verl's trainer loads every training engine, which costs seconds and, on a machine without some
    engine or without a GPU, prints verl's warnings before the launch's one-line refusal."""
    spec = importlib.util.find_spec(V1_PACKAGE)
    names = set()
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for path in sorted(Path(folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_trainer" and \
                        node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    names.add(node.args[0].value)
    return tuple(sorted(names))


def registered_trainers() -> tuple[str, ...]:
    """Every name verl's ``get_trainer_cls`` will find in the recipe's task runner (verl/trainer/ppo/v1/
    trainer_base.py:1996 ``TRAINER_REGISTRY``; :2017 raises "Unknown trainer" for any other): verl's three modes
    (``verl_trainer_names``), the recipe's ``apo_*`` trainers (which ``recipe_apo.integration.trainer`` registers
    under ``RECIPE_TRAINERS``' names; the task runner imports it before verl looks the name up) and, when verl's
    registry is loaded in this process, every name in it: a plugin that registers a trainer of its own imports
    it when ``import verl`` loads the plugin, here as in the task runner."""
    names = {*verl_trainer_names(), *RECIPE_TRAINERS.values()}
    registry = sys.modules.get(V1_REGISTRY_MODULE)
    if registry is not None:
        names.update(getattr(registry, "TRAINER_REGISTRY", {}))
    return tuple(sorted(names))


def _suggestion(value: Any, known: tuple[str, ...]) -> str:
    """" (did you mean X?)" for a name that differs from a known one by case, spaces, dashes or a typo."""
    if not isinstance(value, str):
        return ""
    normal = "_".join(value.strip().lower().replace("-", "_").split())
    close = [normal] if normal in known else difflib.get_close_matches(normal, known, n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def check_trainer_mode(config: Any) -> str:
    """The trainer ``trainer.v1.trainer_mode`` names, if verl's trainer registry has it (``registered_trainers``),
    else ``RecipeConfigError`` naming the value and the registered names. Names are exact: verl looks them up
    as they are, so ``Sync``, ``' sync'`` and ``colocate-async`` are unknown. A trainer of the user's own,
    registered by a verl plugin, passes."""
    value = _get(config, MODE_KEY, "sync")
    known = registered_trainers()
    if isinstance(value, str) and value in known:
        return value
    raise RecipeConfigError(
        f"{MODE_KEY}={_shown(value)} is not a registered trainer{_suggestion(value, known)}; known: "
        f"{', '.join(known)} (verl's modes, the recipe's apo_* trainers and any a verl plugin registers)"
    )


# ---- trainer.v1.* ---------------------------------------------------------------------------------------------
def _mode_section(config: Any, mode: str) -> Mapping:
    """``trainer.v1.<mode>``, the settings verl reads for the mode (trainer_base.py:130 and :157 read it with
    ``.get``: absent is {}, but null or a plain value breaks the ``.get`` after it)."""
    v1 = _get(config, "trainer.v1", {})
    if mode not in v1:
        return {}
    section = v1[mode]
    if not isinstance(section, (Mapping, DictConfig)):
        raise RecipeConfigError(
            f"trainer.v1.{mode}={_shown(section)} must be a mapping of the {mode} trainer's settings (or left out)"
        )
    return section


def _check_parameter_sync_step(config: Any, mode: str, section: Mapping) -> None:
    """``trainer.v1.<mode>.parameter_sync_step`` (trainer_base.py:130, default 1): a whole number >= 1 that
    divides ``data.train_batch_size`` (trainer_base.py:535: each step trains that many mini-batches of
    train_batch_size / parameter_sync_step prompts), and in separate_async exactly
    train_batch_size / ppo_mini_batch_size (trainer_separate_async.py:59)."""
    if "parameter_sync_step" not in section and mode != "separate_async":
        return  # verl's default, 1
    key = f"trainer.v1.{mode}.parameter_sync_step"
    steps = check_integer(key, section.get("parameter_sync_step", 1), RecipeConfigError, low=1)
    batch = _get(config, "data.train_batch_size")
    if not _positive_integer(batch):
        return
    if batch % steps:
        raise RecipeConfigError(
            f"{key}={steps} does not divide data.train_batch_size={batch}: verl trains each step as "
            f"parameter_sync_step mini-batches of equal size; use a divisor of {batch}"
        )
    mini = _get(config, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if mode == "separate_async" and _positive_integer(mini) and batch != steps * mini:
        fix = f"set it to {batch // mini}" if batch % mini == 0 else "make ppo_mini_batch_size divide train_batch_size"
        raise RecipeConfigError(
            f"{key}={steps} with data.train_batch_size={batch} and actor_rollout_ref.actor.ppo_mini_batch_size="
            f"{mini}: verl's separate_async trainer needs train_batch_size = parameter_sync_step * "
            f"ppo_mini_batch_size (one mini-batch per weight sync); {fix}"
        )


def _warmup_bound(config: Any) -> Optional[tuple[int, str, str]]:
    """The largest sensible ``num_warmup_batches``, the key that sets it, and why; None when neither is set.

    Warm-up batches are all drawn when training starts (trainer_base.py:624, before the first step's own batch),
    and the trainer takes the oldest prompts first, so the k-th warm-up batch is trained at the k-th step at the
    earliest, when its span (verl's count of the model versions since it was drawn, replay_buffer.py:528) is k or
    more. With ``trainer.v1.sampler.max_off_policy_threshold`` T (default 8), a batch past the T-th spans more
    than T when its turn comes: the replay buffer drops it
    (``max_off_policy_strategy=drop``, replay_buffer.py:528) or holds training until it is generated (``wait``,
    :550). And a run of ``trainer.total_training_steps`` steps never trains more warm-up batches than it has steps.
    """
    bounds = []
    threshold = _get(config, "trainer.v1.sampler.max_off_policy_threshold")
    if _positive_integer(threshold):
        bounds.append((threshold, "trainer.v1.sampler.max_off_policy_threshold",
                       "the replay buffer would drop them or hold training for them (the k-th spans k model "
                       "versions or more when its turn comes)"))
    steps = _get(config, "trainer.total_training_steps")
    if _positive_integer(steps):
        bounds.append((steps, "trainer.total_training_steps", "the run never trains the rest"))
    return min(bounds) if bounds else None


def _check_warmup(config: Any, mode: str, section: Mapping) -> None:
    """``trainer.v1.<async mode>.num_warmup_batches`` (trainer_colocate_async.py:35, trainer_separate_async.py:231,
    typed ``int | float`` at trainer_base.py:624, fractions in whole gen_batch_size chunks): a finite number >= 0
    (verl takes a negative as 0) and at most ``_warmup_bound``."""
    if "num_warmup_batches" not in section:
        return
    key = f"trainer.v1.{mode}.num_warmup_batches"
    value = check_number(key, section["num_warmup_batches"], RecipeConfigError, low=0)
    bound = _warmup_bound(config)
    if bound is not None and value > bound[0]:
        limit, limit_key, why = bound
        raise RecipeConfigError(
            f"{key}={value!r} is above {limit_key}={limit}: warm-up batches are drawn before the first step, and "
            f"beyond {limit} {why}; use a number in [0, {limit}]"
        )


# verl's HybridRolloutSwitchConfig checks switch_threshold_ratio and switch_cost_window_size (config.py:87, :89);
# the other bounds are what the fields mean (trainer_separate_async.py:302-317): steps of that ratio in [0, 1],
# a count of steps >= 1.
_HYBRID_BOUNDS = {
    "switch_threshold_ratio": dict(low=0, high=1, low_open=True),
    "switch_cost_window_size": dict(low=1),
    "switch_threshold_release_steps": dict(low=1),
    "switch_threshold_step_up": dict(low=0, high=1),
    "switch_threshold_step_down": dict(low=0, high=1),
}


def _check_dataclass_fields(section: Mapping, cls: type, prefix: str, bounds: Mapping[str, dict]) -> None:
    """Every key of ``section`` is a field of verl's dataclass ``cls`` (verl builds it with ``cls(**section)``,
    a TypeError on any other key) holding a value of the field's type: bool, int or float; then ``bounds``."""
    hints = typing.get_type_hints(cls)
    names = [field.name for field in dataclasses.fields(cls) if not field.name.startswith("_")]
    for key in section:
        if key != "_target_" and key not in names:
            raise RecipeConfigError(f"{prefix}.{key} is not a setting of verl's {cls.__name__}; known: "
                                    f"{', '.join(names)}")
    for name in names:
        if name not in section:
            continue
        key, value, hint = f"{prefix}.{name}", section[name], hints[name]
        if hint is bool:
            check_flag(key, value, RecipeConfigError)
        elif hint is int:
            check_integer(key, value, RecipeConfigError, **bounds.get(name, {}))
        elif hint is float:
            check_number(key, value, RecipeConfigError, **bounds.get(name, {}))


def _check_hybrid_rollout(section: Mapping) -> None:
    """``trainer.v1.separate_async.hybrid_rollout`` against verl's ``HybridRolloutSwitchConfig``
    (verl/trainer/config/config.py:74, built at trainer_separate_async.py:86)."""
    from verl.trainer.config import HybridRolloutSwitchConfig

    hybrid = section.get("hybrid_rollout", None)
    if hybrid is None:
        return
    prefix = "trainer.v1.separate_async.hybrid_rollout"
    if not isinstance(hybrid, (Mapping, DictConfig)):
        raise RecipeConfigError(f"{prefix}={_shown(hybrid)} must be a mapping of HybridRolloutSwitchConfig settings")
    _check_dataclass_fields(hybrid, HybridRolloutSwitchConfig, prefix, _HYBRID_BOUNDS)


def _check_sampler(config: Any) -> None:
    """``trainer.v1.sampler``, which every mode's replay buffer reads (trainer_base.py:145-167):
    max_off_policy_threshold a whole number >= 1 or null (replay_buffer.py:166), max_off_policy_strategy drop or
    wait (:175), sync_refill_failed_groups true/false (trainer_base.py:730 reads it with ``bool()``, so a quoted
    'false' is true), custom_sampler's path and name text or null, sampler_kwargs a mapping."""
    sampler = _get(config, "trainer.v1.sampler", None)
    if sampler is None:
        return
    prefix = "trainer.v1.sampler"
    if not isinstance(sampler, (Mapping, DictConfig)):
        raise RecipeConfigError(f"{prefix}={_shown(sampler)} must be a mapping of the replay buffer's settings")
    threshold = sampler.get("max_off_policy_threshold", None)
    if threshold is not None:
        try:
            check_integer(f"{prefix}.max_off_policy_threshold", threshold, RecipeConfigError, low=1)
        except RecipeConfigError as exc:
            raise RecipeConfigError(f"{exc} (or null: no staleness control)") from None
    check_choice(f"{prefix}.max_off_policy_strategy", sampler.get("max_off_policy_strategy", "drop"),
                 MAX_OFF_POLICY_STRATEGIES, RecipeConfigError)
    check_flag(f"{prefix}.sync_refill_failed_groups", sampler.get("sync_refill_failed_groups", False),
               RecipeConfigError)
    custom = sampler.get("custom_sampler", None) or {}
    for name in ("path", "name"):
        value = custom.get(name, None)
        if value is not None and not isinstance(value, str):
            raise RecipeConfigError(f"{prefix}.custom_sampler.{name}={_shown(value)} must be text (or null)")
    kwargs = sampler.get("sampler_kwargs", None)
    if kwargs is not None and not isinstance(kwargs, (Mapping, DictConfig)):
        raise RecipeConfigError(f"{prefix}.sampler_kwargs={_shown(kwargs)} must be a mapping")


def check_v1_settings(config: Any, trainer: str) -> None:
    """The ``trainer.v1.*`` settings verl's V1 trainer reads for ``trainer`` (a registered name; the recipe's
    switch back to verl's mode, whose section verl then reads): parameter_sync_step (any mode), num_warmup_batches
    (the asynchronous modes), hybrid_rollout (separate_async) and the replay buffer's sampler (every mode)."""
    mode = verl_mode(trainer)
    section = _mode_section(config, mode)
    _check_parameter_sync_step(config, mode, section)
    if mode in ASYNC_MODES:
        _check_warmup(config, mode, section)
    if mode == "separate_async":
        _check_hybrid_rollout(section)
        _check_separate_rollout_pool(config)
    _check_sampler(config)


def _check_separate_rollout_pool(config: Any) -> None:
    """What verl's separate_async trainer asserts in its constructor, after the model load
    (trainer_separate_async.py:64-76): a rollout pool of its own (``rollout.nnodes`` and ``rollout.n_gpus_per_node``
    whole numbers >= 1; verl's defaults are 0), weights handed over by a transfer backend (not ``naive``, which
    only works inside one process group), and a reward model, if any, in a resource pool of its own."""
    rollout = "actor_rollout_ref.rollout"
    for key in ("nnodes", "n_gpus_per_node"):
        value = _get(config, f"{rollout}.{key}", 0)
        if not _positive_integer(value):
            raise RecipeConfigError(
                f"{rollout}.{key}={_shown(value)}: trainer.v1.trainer_mode=separate_async generates on a rollout pool "
                f"of its own and needs a whole number >= 1 here (the pool's {key.replace('n_gpus_', 'GPUs ')})"
            )
    backend = _get(config, f"{rollout}.checkpoint_engine.backend", "naive")
    if backend == "naive":
        raise RecipeConfigError(
            f"{rollout}.checkpoint_engine.backend=naive: trainer.v1.trainer_mode=separate_async sends the weights to "
            "its own rollout pool and needs a transfer backend (nccl, nixl, mooncake, ...)"
        )
    if _get(config, "reward.reward_model.enable", False) is True and \
            _get(config, "reward.reward_model.enable_resource_pool", False) is not True:
        raise RecipeConfigError(
            "reward.reward_model.enable_resource_pool=false with trainer.v1.trainer_mode=separate_async: its "
            "standalone rollout never pauses to free GPU memory for a colocated reward model; set it to true"
        )


# ---- token budgets of dynamic batch sizes ----------------------------------------------------------------------
def _sequence_parallel(config: Any, role: str) -> tuple[int, str]:
    """The largest sequence-parallel size set for ``role`` (``SEQUENCE_PARALLEL_KEYS``) and its key; (1, "")
    when none is above 1."""
    best = (1, "")
    for key in SEQUENCE_PARALLEL_KEYS:
        value = _get(config, f"{role}.{key}")
        if _positive_integer(value) and value > best[0]:
            best = (value, f"{role}.{key}")
    return best


def _critic_used(config: Any) -> bool:
    """verl's ``need_critic`` (verl/trainer/ppo/utils.py:96) without its warning: critic.enable, else gae."""
    enable = _get(config, "critic.enable")
    if enable is not None:
        return bool(enable)
    return str(_get(config, "algorithm.adv_estimator")) == "gae"


def _budgets(config: Any) -> list[tuple[str, str, str]]:
    """(flag key, budget key, role whose engine runs it) for each per-GPU token budget a worker of this run
    reads with dynamic batch sizes:

    - the actor's update: actor.ppo_max_token_len_per_gpu (engine_workers.py:626, train_batch :355);
    - the actor's old log-probs: rollout.log_prob_max_token_len_per_gpu (engine_workers.py:621, infer_batch :409);
    - the reference's log-probs, when there is a reference (verl's need_reference_policy: KL in the reward or the
      KL loss): ref.log_prob_max_token_len_per_gpu (engine_workers.py:552, :581);
    - the critic's, when there is one: critic.ppo_infer_max_token_len_per_gpu, which verl 0.9.1's V1 trainer
      uses for both the critic's update and its values (trainer_base.py:267-268; not in verl's YAML, so its
      dataclass default, workers/config/critic.py:89, unless set with +critic.ppo_infer_max_token_len_per_gpu).
    """
    arr = "actor_rollout_ref"
    budgets = [(f"{arr}.actor.use_dynamic_bsz", f"{arr}.actor.ppo_max_token_len_per_gpu", f"{arr}.actor"),
               (f"{arr}.rollout.log_prob_use_dynamic_bsz", f"{arr}.rollout.log_prob_max_token_len_per_gpu",
                f"{arr}.actor")]
    if _get(config, "algorithm.use_kl_in_reward", False) or _get(config, f"{arr}.actor.use_kl_loss", False):
        budgets.append((f"{arr}.ref.log_prob_use_dynamic_bsz", f"{arr}.ref.log_prob_max_token_len_per_gpu",
                        f"{arr}.ref"))
    if _critic_used(config):
        budgets.append(("critic.use_dynamic_bsz", "critic.ppo_infer_max_token_len_per_gpu", "critic"))
    return budgets


def _critic_default_budget() -> int:
    from verl.workers.config import CriticConfig

    return next(field.default for field in dataclasses.fields(CriticConfig)
                if field.name == "ppo_infer_max_token_len_per_gpu")


def check_token_budgets(config: Any) -> None:
    """With dynamic batch sizes, verl packs whole sequences into micro-batches of at most budget x
    sequence-parallel size tokens, and asserts that the longest sequence fits (utils/seqlen_balancing.py:384,
    "max_token_len must be greater than the sequence length"), in a Ray worker, at the first batch. A sequence
    is up to data.max_prompt_length + data.max_response_length tokens, so each budget in use (``_budgets``) must
    reach that. The actor's two flags must also agree (engine_workers.py:616 asserts they do)."""
    arr = "actor_rollout_ref"
    actor_flag = check_flag(f"{arr}.actor.use_dynamic_bsz", _get(config, f"{arr}.actor.use_dynamic_bsz", False),
                            RecipeConfigError)
    rollout_flag = _get(config, f"{arr}.rollout.log_prob_use_dynamic_bsz", actor_flag)
    check_flag(f"{arr}.rollout.log_prob_use_dynamic_bsz", rollout_flag, RecipeConfigError)
    if rollout_flag != actor_flag:
        raise RecipeConfigError(
            f"{arr}.rollout.log_prob_use_dynamic_bsz={str(rollout_flag).lower()} with {arr}.actor.use_dynamic_bsz="
            f"{str(actor_flag).lower()}: verl's actor worker needs both the same (its old log-probs and its update "
            "run in one engine); leave log_prob_use_dynamic_bsz to follow use_dynamic_bsz"
        )
    longest = None
    for flag_key, budget_key, role in _budgets(config):
        if not check_flag(flag_key, _get(config, flag_key, False), RecipeConfigError):
            continue
        if longest is None:
            prompt = check_integer("data.max_prompt_length", _get(config, "data.max_prompt_length"),
                                   RecipeConfigError, low=1)
            response = check_integer("data.max_response_length", _get(config, "data.max_response_length"),
                                     RecipeConfigError, low=1)
            longest = prompt + response
        default = _critic_default_budget() if role == "critic" else None
        budget = check_integer(budget_key, _get(config, budget_key, default), RecipeConfigError)
        parallel, parallel_key = _sequence_parallel(config, role)
        if budget * parallel >= longest:
            continue
        times = f" x {parallel_key}={parallel}" if parallel > 1 else ""
        needed = -(-longest // parallel)
        how = f"+{budget_key}={needed} (verl's default is {budget})" if _get(config, budget_key) is None else \
            f"it to at least {needed}"
        raise RecipeConfigError(
            f"{budget_key}={budget}{times} with {flag_key}=true is below data.max_prompt_length + "
            f"data.max_response_length = {longest}: verl packs whole sequences into micro-batches of at most that "
            f"many tokens per GPU, so the longest must fit; set {how}"
        )


# ---- verl's own check -------------------------------------------------------------------------------------------
def check_with_verl(config: Any) -> None:
    """verl's own config check, ``verl.utils.config.validate_config`` (the batch sizes' divisibility by the
    GPUs, its actor, rollout, reference and critic dataclasses' ``__post_init__`` and ``validate()``), the one
    ``main_ppo`` runs before Ray starts: run by the launch in ``prepare``, so a dry run refuses what the real
    launch refuses, and said as one line instead of verl's traceback."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        with warnings.catch_warnings():
            # need_critic's note for every estimator but gae, said where no critic was asked for
            warnings.filterwarnings("ignore", message="Disabled critic as algorithm.adv_estimator != gae")
            use_critic = need_critic(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=use_critic)
    except Exception as exc:  # verl says a bad setting with assert, ValueError, TypeError or OmegaConf's errors
        while exc.__cause__ is not None or exc.__context__ is not None:  # Hydra's instantiate wraps verl's own
            exc = exc.__cause__ or exc.__context__
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise RecipeConfigError(f"verl's config check refused the run: {lines[0]}") from None

