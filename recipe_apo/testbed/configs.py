"""One composed config per compared method, through Hydra: ``testbed.yaml`` + the command line + the method's
entry in ``methods`` (which picks a preset of the recipe's own ``method`` group, conf/method/*.yaml).

Importing this module stores the testbed's settings (``settings.Testbed``, at their declared defaults) in Hydra's
ConfigStore as ``testbed_settings``, which ``testbed.yaml``'s defaults list takes before its own keys, and each
task's (``settings.TASK_CLASSES``) as an option of the ``task`` group. The defaults of ``methods`` (every preset,
labelled by its name) and ``league.methods`` (every preset's label) come from the presets themselves
(``recipe_apo.integration.presets``), so the command line still sets, adds to (``+methods.sapo=[...]``) or drops
from (``~methods.drgrpo``) them.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Callable, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from recipe_apo.errors import RecipeError
from recipe_apo.integration import hydra_stages
from recipe_apo.integration.hydra_stages import compose_in_two_stages
from recipe_apo.testbed import settings
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.hydra_errors import hydra_line
from recipe_apo.testbed.launch_refusal import LaunchRefusal, check_launch
from recipe_apo.testbed.setting_rules import text
from recipe_apo.testbed.verl_config import verl_read_node

CONFIG_NAME = "testbed"
# The ConfigStore entry of the settings' defaults (testbed.yaml's defaults list names it).
SETTINGS_NODE = "testbed_settings"
# The keys of verl's own ppo_trainer that the testbed reads, at verl's values, composed once per process
# (``verl_config.verl_read_node``).
VERL_NODE = "verl_ppo_trainer"


def store_settings() -> None:
    """(Re)store the declared defaults: ``testbed_settings`` and the ``task`` group's options (again after the
    presets changed: ``methods`` and ``league.methods`` follow them)."""
    store = ConfigStore.instance()
    store.store(name=VERL_NODE, node=verl_read_node())
    store.store(name=SETTINGS_NODE, node=asdict(settings.Testbed()))
    for name, task in settings.TASK_CLASSES.items():
        store.store(group="task", name=name, node=asdict(task()))
    _REFERENCES.clear()
    _ALONE.clear()
    hydra_stages.clear()  # the presets, and so the group files, may have changed


# A method entry's own signature (METHOD_KEYS of testbed.yaml + the entry alone), by entry: it depends on nothing
# else, and composing it again for every scenario of a league cost a compose per method and scenario.
_REFERENCES: dict[tuple[str, ...], tuple] = {}
# Whether the launch takes an entry's own overrides (on the testbed's defaults), by entry.
_ALONE: dict[tuple[str, ...], bool] = {}


store_settings()

# The keys that make a method what it is; a command-line change to one of them shows in the method's label.
METHOD_KEYS = (
    "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.loss_agg_mode",
    "algorithm.zero_variance",
)


# What every method of a seed shares (the seed's setup is built once, from the first method's config): a
# method's own entry may not change them.
SHARED_KEYS = ("rounds", "seeds", "task", "task.", "scenario", "eval.", "pretrain.", "policy.", "data.train_batch_size",
               "data.max_response_length", "actor_rollout_ref.rollout.n", "eval_every")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _method_signature(cfg: DictConfig) -> tuple:
    return tuple(OmegaConf.select(cfg, key) for key in METHOD_KEYS)


def compose_testbed(overrides: list[str], where: str = "") -> DictConfig:
    """``compose(testbed, overrides)`` (in its two stages, the first cached: ``integration.hydra_stages``); an
    error Hydra or OmegaConf raises is refused as one line naming the override (and ``where`` it came from, e.g.
    `` (in methods.x: [...])``)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose_in_two_stages(CONFIG_NAME, list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise TestbedSettingError(hydra_line(exc, overrides) + where) from None


def method_configs(overrides: list[str], entries: Optional[dict[str, list[str]]] = None,
                   check: Optional[Callable[[DictConfig], None]] = None,
                   left_out: Optional[dict[str, str]] = None) -> dict[str, DictConfig]:
    """label -> composed config. Needs an initialized Hydra (inside the app, or ``initialize_config_module``).

    ``entries`` (label -> overrides, e.g. ``league_entries``) runs those; else ``method=<preset>`` among
    ``overrides`` runs that preset alone; otherwise every ``methods`` entry runs. A label gains
    ``[estimator+loss ...]`` when the command line changed what its preset defines. ``check``, when given, is
    called on each config, and so is what the recipe's launch refuses (``launch_refusal.check_launch``); what they
    refuse in a method's own overrides is said with the method's entry.

    Of several entries (``methods``' or the league's, not ``method=``), one that the launch refuses only under the
    run's shared settings (the command line's ``staleness=2`` or a scenario's, with R2PO), not on its own
    overrides, is left out, said in one line: into ``left_out`` (label -> the launch's line) when given, else on
    stderr. An entry refused on its own overrides, or every entry left out, is refused.
    """
    base = compose_testbed(overrides)
    if check is not None:
        check(base)  # the command line's own settings, said as they are (its method, unless chosen, a placeholder)
    chosen = [o for o in overrides if _key(o) == "method"]
    several = not chosen
    if entries is not None:
        entries = {label: list(extra) for label, extra in entries.items()}
    elif chosen:
        entries = {chosen[-1].split("=", 1)[1]: []}
    else:
        methods = base.get("methods")
        if not OmegaConf.is_dict(methods) or not all(OmegaConf.is_list(v) for v in methods.values()):
            raise TestbedSettingError(
                f"methods={text(OmegaConf.to_container(methods) if OmegaConf.is_config(methods) else methods)}: a "
                "mapping of label -> list of overrides, e.g. +methods.sapo=[method=grpo,"
                "actor_rollout_ref.actor.policy_loss.loss_mode=sapo]")
        entries = {str(label): [str(o) for o in extra] for label, extra in methods.items()}
    user = overrides
    out: dict[str, DictConfig] = {}
    refused: dict[str, str] = {}
    for label, extra in entries.items():
        where = f" (in methods.{label}: {text(extra)})" if extra and extra != [f"method={label}"] else ""
        shared = [o for o in extra if any(_key(o) == k or (k.endswith(".") and _key(o).startswith(k))
                                          for k in SHARED_KEYS)]
        if shared:
            raise TestbedSettingError(
                f"methods.{label} sets {', '.join(shared)}: every method of a seed shares the rounds, task, "
                "prompts, group size, evaluation and warm-up; set it on the command line for all methods"
            )
        cfg = compose_testbed(list(user) + extra, where)
        own = tuple(extra if extra else [f"method={label}"])
        if check is not None:
            try:
                check(cfg)
                check_launch(cfg)
            except LaunchRefusal as exc:
                line = " ".join(str(exc).split())
                if several and _launch_passes(own, where):
                    refused[label] = line
                    continue
                raise (exc if not where else LaunchRefusal(line + where)) from None
            except RecipeError as exc:
                if not where:
                    raise
                raise TestbedSettingError(" ".join(str(exc).split()) + where) from None
        if own not in _REFERENCES:
            _REFERENCES[own] = _method_signature(compose_testbed(list(own), where))
        reference = _REFERENCES[own]
        if _method_signature(cfg) != reference:
            changed = [str(v) for v, r in zip(_method_signature(cfg), reference) if v != r]
            label = f"{label}[{'+'.join(changed)}]"
        out[label] = cfg
    if refused and not out:  # nothing left to run: the first refusal, as it is
        label, line = next(iter(refused.items()))
        raise LaunchRefusal(f"{line} (in methods.{label}: {text(entries[label])})")
    for label, line in refused.items():
        if left_out is not None:
            left_out.setdefault(label, line)
        else:
            print(f"recipe-apo: note: methods.{label} is left out of this run: {line}", file=sys.stderr, flush=True)
    return out


def _launch_passes(own: tuple[str, ...], where: str) -> bool:
    """Whether the recipe's launch takes the entry ``own`` on its own (the testbed's defaults and its overrides)."""
    if own not in _ALONE:
        try:
            check_launch(compose_testbed(list(own), where))
            _ALONE[own] = True
        except RecipeError:
            _ALONE[own] = False
    return _ALONE[own]


def league_entries(cfg: DictConfig) -> dict[str, list[str]]:
    """The league's methods, label -> overrides: each of ``league.methods`` (a label of ``methods``), then each of
    ``league.extra``, as it is and then with each of its ``league.variants`` (label ``<method>_<suffix>``; a
    suffix named in ``league.variant_of`` only for the methods listed there), in that order."""
    extra = cfg.league.get("extra") or {}
    variant_of = cfg.league.get("variant_of") or {}
    bases: dict[str, list[str]] = {}
    for name in cfg.league.methods:
        if name not in cfg.methods:
            raise TestbedSettingError(f"league.methods={text(list(cfg.league.methods))}: {name} is not a label of "
                                      f"methods ({', '.join(cfg.methods)})")
        bases[str(name)] = list(cfg.methods[name])
    for name, overrides in extra.items():
        if name in bases:
            raise TestbedSettingError(f"league.extra.{name}={text(list(overrides))}: league.methods runs {name} "
                                      "already; name it otherwise")
        bases[str(name)] = list(overrides)
    for suffix, names in variant_of.items():
        if suffix not in cfg.league.variants:
            raise TestbedSettingError(f"league.variant_of.{suffix}={text(list(names))}: {suffix} is not a suffix of "
                                      f"league.variants ({', '.join(cfg.league.variants)})")
        unknown = [n for n in names if n not in cfg.methods and n not in extra]
        if unknown:
            raise TestbedSettingError(f"league.variant_of.{suffix}={text(list(names))}: {', '.join(map(str, unknown))}"
                                      " not a label of methods or league.extra")
    out: dict[str, list[str]] = {}
    for name, overrides in bases.items():
        out[name] = overrides
        for suffix, more in cfg.league.variants.items():
            if suffix not in variant_of or name in variant_of[suffix]:
                out[f"{name}_{suffix}"] = overrides + list(more)
    if not out:
        raise TestbedSettingError("league.methods=[]: name at least one label of methods (league.extra is empty)")
    return out


def task_overrides() -> Optional[list[str]]:
    """The command line's overrides of the running Hydra app (a multirun job's include its sweep values)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    # As written: iterating the node would resolve an override's ${...} (rounds=${oops}) as Hydra's own key.
    return [str(o) for o in OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)]
