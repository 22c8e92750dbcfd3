"""The check of a composed testbed config against what ``settings.py`` declares: each key the testbed reads, its
own and verl's (``settings.VERL_KEYS``), against its rule (``setting_rules.Rule``), in the order declared; a
key the testbed does not read refused (Hydra's ``+task.K=7`` adds one; the message names it and lists the known
ones), a key of verl's it does not read changed from verl's value too (``verl_config``), a deleted or unset one
too. Each refusal is a ``TestbedSettingError`` whose message is one line: ``<key>=<value>: <what is allowed>``.
``read_values`` is a checked config as the testbed reads it.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Callable, Optional

from recipe_apo.testbed import settings as declared
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.setting_rules import MethodNode, Rule, refuse, text, value_at
from recipe_apo.testbed.settings import ACTOR_KEY, OPTIONAL, TASK_CLASSES, TASKS
from recipe_apo.testbed.verl_config import verl_actor_rules, verl_reference, verl_type, verl_values


def _rules(cls: type, prefix: str) -> dict[str, Any]:
    """key -> Rule for every field of the settings dataclass ``cls`` and of the dataclasses it nests, in order."""
    hints = typing.get_type_hints(cls, vars(declared))
    out: dict[str, Any] = {}
    for f in fields(cls):
        tp = hints[f.name]
        if is_dataclass(tp):
            out.update(_rules(tp, f"{prefix}{f.name}."))
        else:
            default = None if f.default is MISSING else f.default
            out[f"{prefix}{f.name}"] = Rule(tp, dict(f.metadata), default)
    return out


def _method_nodes() -> dict[str, MethodNode]:
    from recipe_apo.methods import catalog

    return {f"algorithm.{m.settings_key}": MethodNode(m) for m in catalog.methods() if m.settings is not None}


@functools.lru_cache(maxsize=1)
def setting_rules() -> dict[str, Any]:
    """Every key the testbed reads with what it takes: its own settings (``settings.Testbed``), the methods'
    nodes, and verl's keys (``settings.VERL_KEYS``)."""
    verl = {key: Rule(verl_type(key, entry), {k: v for k, v in entry.items() if k != "type"},
                      value_at(verl_values(), key)) for key, entry in declared.VERL_KEYS.items()}
    return {**_rules(declared.Testbed, ""), **_method_nodes(), **verl}


@functools.lru_cache(maxsize=None)
def task_rules(task: str) -> dict[str, Any]:
    """``task.<key>`` of the task ``task`` (``settings.TASK_CLASSES``), ``task.name`` first."""
    return _rules(TASK_CLASSES[task], "task.")


# --- the check -------------------------------------------------------------------------------------------------

def _children(settings: dict[str, Any], node: str) -> list[str]:
    """The known keys (and nodes) right under ``node`` ("" for the top)."""
    prefix = f"{node}." if node else ""
    names: list[str] = []
    for key in settings:
        if key.startswith(prefix):
            first = key[len(prefix):].split(".")[0]
            if first not in names:
                names.append(first)
    return names


def check_settings(cfg: Any) -> None:
    """Refuse, with one line naming the key, any setting of a composed testbed config (``cfg``: a DictConfig or
    its plain dict) that the testbed does not read, or that is of the wrong type or out of bounds, and any key of
    verl's the testbed does not read that differs from verl's own value (``verl_reference``). No relation between
    settings is checked here (``min_len <= max_len``: the task's own check)."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(cfg, (dict, DictConfig)):
        raise TestbedSettingError(f"the testbed's config must be a mapping, got {text(cfg)}")
    raw = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    resolve = _resolver(cfg)
    task = raw.get("task")
    name = resolve("task.name", task.get("name")) if isinstance(task, dict) else None
    if isinstance(task, dict):
        Rule(str, {"choices": TASKS}).check("task.name", name)
    settings = {**setting_rules(), **task_rules(name if name in TASKS else "reverse")}
    # In the order declared, a value that interpolates another after the values written out: a refused value is
    # named where it was set.
    copies = {key for key in settings if "${" in str(value_at(raw, key))}
    for key, rule in sorted(settings.items(), key=lambda item: item[0] in copies):
        value = _lookup(raw, key, settings)
        if isinstance(value, Absent):
            gone = value.key
            what = rule.allowed if gone == key else f"the settings {', '.join(_children(settings, gone))}"
            if gone not in OPTIONAL:
                raise TestbedSettingError(f"{gone}: missing (deleted with ~{gone}?); the testbed needs it: {what}")
        elif value == "???":
            raise TestbedSettingError(f"{key}=???: not set; {rule.allowed}")
        else:
            rule.check(key, resolve(key, value))
    _check_others(raw, resolve, "", settings, name)


def _resolver(cfg: Any) -> Callable[[str, Any], Any]:
    """``resolve(key, value)``: the value as written, or, where it interpolates, resolved in ``cfg`` (one that does
    not resolve is refused naming its key). Only those go through OmegaConf: resolving all of verl's tree for
    every config of a league cost ten times the rest of the check."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    made: list = []

    def resolve(key: str, value: Any) -> Any:
        if "${" not in str(value):
            return value
        if not made:
            made.append(cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg))
        try:
            node = OmegaConf.select(made[0], key, throw_on_missing=False)
            return OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
        except OmegaConfBaseException as exc:
            reason = " ".join(str(exc).split("\n")[0].split())
            raise TestbedSettingError(f"{key}={text(value)}: does not resolve ({reason})") from None

    return resolve


def read_values(cfg: Any) -> dict:
    """A checked config as the testbed reads it, as plain values (interpolations resolved): its own settings, the
    task's, the methods' nodes, and the keys of verl's it reads (``VERL_KEYS`` and the actor fields it passes on).
    The rest of verl's tree is verl's own values (``check_settings``): left out, as what the runs record."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    resolve = _resolver(cfg)
    name = resolve("task.name", value_at(raw, "task.name"))
    out: dict = {}
    for key in [*setting_rules(), *task_rules(name if name in TASKS else "reverse"), *verl_actor_rules()]:
        value = _lookup(raw, key, {})
        if not isinstance(value, Absent):
            *parents, last = key.split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = resolve(key, value)
    return out


@dataclass(frozen=True)
class Absent:
    """What ``_lookup`` finds where a key is not: the first node or key on the way that is absent."""

    key: str


def _lookup(values: dict, key: str, settings: dict[str, Any]) -> Any:
    """The value of ``key``, or ``Absent``; a node above it that is not a mapping is refused."""
    node, path = values, ""
    for part in key.split("."):
        if not isinstance(node, dict):
            raise refuse(path, node, f"a mapping of {path}'s settings: {', '.join(_children(settings, path))}")
        path = f"{path}.{part}" if path else part
        if part not in node:
            return Absent(path)
        node = node[part]
    return node


def _check_others(raw: dict, resolve: Callable, path: str, settings: dict[str, Any], task: Optional[str]) -> None:
    """Every key at ``path`` that no setting declares (``raw``: as written): a field of verl's actor config passed
    on, a key of verl's at verl's value (a preset may restate one), or refused."""
    for key, value in raw.items():
        full = f"{path}.{key}" if path else str(key)
        if full in settings:
            continue
        passed_on = verl_actor_rules().get(full) if full.startswith(f"{ACTOR_KEY}.") else None
        if passed_on is not None:
            passed_on.check(full, resolve(full, value))
        elif any(k.startswith(f"{full}.") for k in settings) or (
                isinstance(value, dict) and isinstance(value_at(verl_reference(), full), dict)):
            _check_others(value, resolve, full, settings, task)
        elif value != value_at(verl_reference(), full, MISSING):
            raise TestbedSettingError(f"{full}={text(value)}: {unknown_setting(full, task)}")


def unknown_setting(key: str, task: Optional[str] = None) -> str:
    """What to say of ``key``, a key the testbed does not read: verl's value where it is verl's, and the keys the
    testbed reads beside it."""
    verls = value_at(verl_values(), key, MISSING)
    if verls is not MISSING and not isinstance(verls, dict):
        return f"verl's setting, which the testbed does not read: keep verl's {text(verls)}; {_known_beside(key, task)}"
    other = [t for t in TASKS if t != (task or "reverse") and key in task_rules(t)]
    also = f" ({key} is task={other[0]}'s)" if other else ""
    return f"not a setting the testbed reads{also}; {_known_beside(key, task)}"


def _known_beside(key: str, task: Optional[str]) -> str:
    """``<node>'s settings: <the keys the testbed reads there>``, of the nearest node above ``key`` it reads in."""
    settings = {**setting_rules(), **task_rules(task if task in TASKS else "reverse")}
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    while parent and not any(k.startswith(f"{parent}.") for k in settings):
        parent = parent.rsplit(".", 1)[0] if "." in parent else ""
    known = _children(settings, parent)
    if parent in (ACTOR_KEY, f"{ACTOR_KEY}.policy_loss"):
        known += [k.rsplit(".", 1)[1] for k in verl_actor_rules() if k.rsplit(".", 1)[0] == parent]
    where = {"": "the testbed's settings", "task": f"task={task or 'reverse'}'s settings"}.get(
        parent, f"{parent}'s settings")
    return f"{where}: {', '.join(known)}"


