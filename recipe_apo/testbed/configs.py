"""One composed config per compared method, through Hydra: ``testbed.yaml`` + the command line + the method's
entry in ``methods`` (which picks a preset of the recipe's own ``method`` group, conf/method/*.yaml).

The defaults of ``methods`` (every preset, labelled by its name) and ``league.methods`` (every preset's label)
come from the presets themselves (``recipe_apo.integration.presets``): importing this module stores them in
Hydra's ConfigStore as ``testbed_presets``, which ``testbed.yaml``'s defaults list takes before its own keys, so
``testbed.yaml`` and the command line still set, add to (``+methods.sapo=[...]``) or drop from
(``~methods.drgrpo``) them.
"""

from __future__ import annotations

from typing import Optional

from hydra import compose
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from recipe_apo.integration import presets

CONFIG_NAME = "testbed"
# The ConfigStore entry of the preset defaults (testbed.yaml's defaults list names it).
PRESET_DEFAULTS = "testbed_presets"


def preset_defaults() -> dict:
    """``methods``: label -> overrides, ``method=<preset>`` for every preset; ``league.methods``: their labels;
    both in the presets' order."""
    names = presets.names()
    return {"methods": {name: [f"method={name}"] for name in names}, "league": {"methods": list(names)}}


def store_preset_defaults() -> None:
    """(Re)store ``preset_defaults()`` as the ``testbed_presets`` config that testbed.yaml composes."""
    ConfigStore.instance().store(name=PRESET_DEFAULTS, node=preset_defaults())


store_preset_defaults()

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


def method_configs(overrides: list[str], entries: Optional[dict[str, list[str]]] = None) -> dict[str, DictConfig]:
    """label -> composed config. Needs an initialized Hydra (inside the app, or ``initialize_config_module``).

    ``entries`` (label -> overrides, e.g. ``league_entries``) runs those; else ``method=<preset>`` among
    ``overrides`` runs that preset alone; otherwise every ``methods`` entry runs. A label gains
    ``[estimator+loss ...]`` when the command line changed what its preset defines.
    """
    base = compose(config_name=CONFIG_NAME, overrides=overrides)
    chosen = [o for o in overrides if _key(o) == "method"]
    if entries is not None:
        entries = {label: list(extra) for label, extra in entries.items()}
        user = overrides
    elif chosen:
        entries = {chosen[-1].split("=", 1)[1]: []}
        user = overrides
    else:
        entries = {label: list(extra) for label, extra in base.methods.items()}
        user = overrides
    out: dict[str, DictConfig] = {}
    for label, extra in entries.items():
        shared = [o for o in extra if any(_key(o) == k or (k.endswith(".") and _key(o).startswith(k))
                                          for k in SHARED_KEYS)]
        if shared:
            raise ValueError(
                f"methods.{label} sets {', '.join(shared)}: every method of a seed shares the rounds, task, "
                "prompts, group size, evaluation and warm-up; set it on the command line for all methods"
            )
        cfg = compose(config_name=CONFIG_NAME, overrides=list(user) + extra)
        reference = compose(config_name=CONFIG_NAME, overrides=extra if extra else [f"method={label}"])
        if _method_signature(cfg) != _method_signature(reference):
            changed = [str(v) for v, r in zip(_method_signature(cfg), _method_signature(reference)) if v != r]
            label = f"{label}[{'+'.join(changed)}]"
        out[label] = cfg
    return out


def league_entries(cfg: DictConfig) -> dict[str, list[str]]:
    """The league's methods, label -> overrides: each of ``league.methods`` (a label of ``methods``), then each of
    ``league.extra``, as it is and then with each of its ``league.variants`` (label ``<method>_<suffix>``; a
    suffix named in ``league.variant_of`` only for the methods listed there), in that order."""
    extra = cfg.league.get("extra") or {}
    variant_of = cfg.league.get("variant_of") or {}
    bases: dict[str, list[str]] = {}
    for name in cfg.league.methods:
        if name not in cfg.methods:
            raise ValueError(
                f"league.methods names {name!r}, which is not a label of methods ({', '.join(cfg.methods)})")
        bases[str(name)] = list(cfg.methods[name])
    for name, overrides in extra.items():
        if name in bases:
            raise ValueError(f"league.extra names {name!r}, which league.methods runs already")
        bases[str(name)] = list(overrides)
    for suffix, names in variant_of.items():
        if suffix not in cfg.league.variants:
            raise ValueError(f"league.variant_of names {suffix!r}, which is not a suffix of league.variants "
                             f"({', '.join(cfg.league.variants)})")
        unknown = [n for n in names if n not in cfg.methods and n not in extra]
        if unknown:
            raise ValueError(f"league.variant_of.{suffix} names {', '.join(map(str, unknown))}: not a label of "
                             "methods or league.extra")
    out: dict[str, list[str]] = {}
    for name, overrides in bases.items():
        out[name] = overrides
        for suffix, more in cfg.league.variants.items():
            if suffix not in variant_of or name in variant_of[suffix]:
                out[f"{name}_{suffix}"] = overrides + list(more)
    if not out:
        raise ValueError("league.methods and league.extra are empty: name at least one label of methods")
    return out


def task_overrides() -> Optional[list[str]]:
    """The command line's overrides of the running Hydra app (a multirun job's include its sweep values)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)
