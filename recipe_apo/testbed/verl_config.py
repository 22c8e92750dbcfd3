"""The testbed's view of verl's own config: verl's ``ppo_trainer`` as the installed verl composes it
(``verl_reference``), the types of its keys (``verl_type``), the actor fields the testbed passes on to verl
(``verl_actor_rules``), and the part of it the testbed reads at verl's values (``verl_read_node``), which
``testbed.yaml`` composes first.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import MISSING, fields
from typing import Any, Mapping, Optional

from recipe_apo.testbed import settings as declared
from recipe_apo.testbed.setting_rules import Rule, not_none, value_at
from recipe_apo.testbed.settings import ACTOR_KEY


@functools.lru_cache(maxsize=1)
def verl_reference() -> dict:
    """verl's own ``ppo_trainer``, as its files compose it (interpolations kept): the values a key the testbed does
    not read must keep. Composed apart from any Hydra the caller has initialized."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path("pkg://verl.trainer.config"))
    config = loader.load_configuration("ppo_trainer", overrides=[], run_mode=RunMode.RUN)
    return {k: v for k, v in OmegaConf.to_container(config, resolve=False).items() if k != "hydra"}


@functools.lru_cache(maxsize=1)
def verl_values() -> dict:
    """``verl_reference`` resolved in itself: the values a refusal names."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(verl_reference()), resolve=True)


def verl_type(key: str, entry: Mapping) -> Any:
    """A verl key's type: the entry's own ``type``, else the annotation in the dataclass its node's ``_target_``
    names, else the type of verl's default (a choice of strings where verl has none)."""
    from hydra.utils import get_class

    if "type" in entry:
        return entry["type"]
    node, name = key.rsplit(".", 1)
    target = value_at(verl_reference(), f"{node}._target_")
    hint = typing.get_type_hints(get_class(target)).get(name) if isinstance(target, str) else None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return Optional[not_none(typing.get_args(hint))]
    if hint is not None and hint is not Any:
        return hint
    default = value_at(verl_reference(), key)
    return str if default is None else type(default)


@functools.lru_cache(maxsize=1)
def verl_actor_rules() -> dict[str, Rule]:
    """``actor_rollout_ref.actor.<field>`` (and ``.policy_loss.<field>``) for each scalar field of verl's actor
    config (its loss config) that ``VERL_KEYS`` does not name: the testbed passes them on to verl
    (``update.actor_config``) for the registered losses to read, typed as verl declares them."""
    from hydra.utils import get_class

    out: dict[str, Rule] = {}
    for node in (ACTOR_KEY, f"{ACTOR_KEY}.policy_loss"):
        for field in fields(get_class(value_at(verl_reference(), f"{node}._target_"))):
            key = f"{node}.{field.name}"
            annotation = verl_type(key, {})
            scalar = not_none(typing.get_args(annotation)) if typing.get_origin(annotation) is typing.Union \
                else annotation
            if scalar in (bool, int, float, str) and field.name not in declared.VERL_NOT_SETTABLE \
                    and key not in declared.VERL_KEYS:
                out[key] = Rule(annotation, {"low": 0, "high": 2**31 - 1} if scalar is int else {})
    return out


@functools.lru_cache(maxsize=1)
def verl_read_node() -> dict:
    """The part of verl's ``ppo_trainer`` the testbed reads (``VERL_KEYS`` and the actor fields it passes on), at
    verl's values (resolved in verl's config): what ``testbed.yaml`` composes first (``configs.VERL_NODE``). The
    rest of verl's tree stays out: a key of it is refused by Hydra (``unknown_setting`` names it verl's), and
    copying verl's whole tree for each of a league's configs cost the fast suite a minute."""
    out: dict = {}
    for key in [*declared.VERL_KEYS, *verl_actor_rules()]:
        value = value_at(verl_values(), key, MISSING)
        if value is not MISSING:
            *parents, last = key.split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
    return out
