"""The check of a composed testbed config against the settings ``settings.py`` declares: each key's type and
bounds read from its field (annotation and ``setting(...)`` bounds), a key the testbed does not read refused
(Hydra's ``+task.K=7`` adds one; the message names it and lists the known ones), a deleted or unset one too; and
what the recipe's launch refuses of a method's config (``check_launch``: the methods' own launch checks).

Each refusal is a ``TestbedSettingError`` whose message is one line: ``<key>=<value>: <what is allowed>``; so is
an error Hydra raises while reading the command line (``hydra_line``).
"""

from __future__ import annotations

import functools
import math
import types
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from recipe_apo.errors import RecipeError
from recipe_apo.testbed import settings as declared
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.settings import ACTOR_KEY, OPTIONAL, TASK_CLASSES, TASKS, Label, Override


def text(value: Any, limit: int = 160) -> str:
    """A value as it would be written on the command line: ``null``, ``true``, ``1.5``, ``nan``, ``[0,1]``; a
    string that would read as something else (a number, a boolean, empty) in quotes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        shown = f"'{value}'" if _reads_as_other(value) else value
        shown = shown.replace("\r", "\\r").replace("\n", "\\n")  # the message stays one line
    elif isinstance(value, (list, tuple)):
        shown = "[" + ",".join(text(v, limit) for v in value) + "]"
    elif isinstance(value, dict):
        shown = "{" + ",".join(f"{k}:{text(v, limit)}" for k, v in value.items()) + "}"
    else:
        shown = str(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _literal(value: str) -> bool:
    """Whether the string is a number, a boolean or null in Hydra's grammar (``'5'``: quoted on purpose?)."""
    if value.lower() in ("true", "false", "null"):
        return True
    try:
        float(value)
    except ValueError:
        return False
    return True


def _reads_as_other(value: str) -> bool:
    return value.strip() != value or value == "" or _literal(value)


def refuse(key: str, value: Any, allowed: str) -> TestbedSettingError:
    """The one-line refusal ``<key>=<value>: <allowed>``, with a hint when a quoted number or boolean is the
    cause (Hydra reads ``'5'`` as a string)."""
    hint = " (a string: drop the quotes)" if isinstance(value, str) and _literal(value) else ""
    return TestbedSettingError(f"{key}={text(value)}: {allowed}{hint}")


# --- what a field takes ---------------------------------------------------------------------------------------

def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _span(bounds: Mapping) -> str:
    low, high = bounds.get("low"), bounds.get("high")
    left = "(" if bounds.get("low_open") else "["
    right = ")" if bounds.get("high_open") else "]"
    return f"{left}{low:g}, {high:g}{right}"


def _within(value: float, bounds: Mapping) -> bool:
    low, high = bounds.get("low"), bounds.get("high")
    if low is not None and (value <= low if bounds.get("low_open") else value < low):
        return False
    return high is None or (value < high if bounds.get("high_open") else value <= high)


_OVERRIDES_EXAMPLE = "[method=grpo,actor_rollout_ref.actor.policy_loss.loss_mode=sapo]"


@dataclass(frozen=True)
class Rule:
    """What one setting takes, read from its declaration: ``annotation`` (a type of settings.py), ``bounds`` (the
    field's ``setting(...)`` metadata), ``default`` (for ``fixed``)."""

    annotation: Any
    bounds: Mapping = None  # type: ignore[assignment]
    default: Any = None

    @property
    def _b(self) -> Mapping:
        return self.bounds or {}

    @property
    def allowed(self) -> str:
        tp, b = self.annotation, self._b
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Union:
            return f"null or {Rule(_not_none(args), b).allowed}"
        if "fixed" in b:
            return f"must be {text(self.default)}: {b['fixed']}"
        if tp is bool:
            return "true or false"
        if tp is int:
            return f"a whole number in [{b['low']}, {b['high']}]"
        if tp is float:
            return "a finite number" if b.get("low") is None and b.get("high") is None else \
                f"a finite number in {_span(b)}"
        if tp is str:
            return f"one of {', '.join(b['choices'])}" if "choices" in b else "a non-empty string"
        if origin is tuple:
            return f"a list of {len(args)} finite numbers in {_span(b)}, e.g. {b['example']}".replace(
                "a list of 2 ", "a list of two ")
        if origin is list:
            (item,) = args
            if item is int:
                distinct = "distinct " if b.get("distinct", True) else ""
                return (f"a non-empty list of {distinct}whole numbers in [{b['low']}, {b['high']}], "
                        f"e.g. {b['example']}")
            if item is Override:
                return f"a list of overrides, e.g. {b.get('example', _OVERRIDES_EXAMPLE)}"
            if item is Label:
                return f"a list of {b.get('what', 'labels')}, e.g. {b.get('example', '[grpo,apo]')}"
            if item == list[Override]:
                return f"a non-empty list of override lists, e.g. {b['example']}"
        if origin is dict:
            entry = Rule(args[1]).allowed.split(", e.g.")[0]
            return f"a mapping of label -> {entry}, e.g. {b['example']}"
        raise TypeError(f"settings.py declares a setting of a type the check does not know: {tp}")

    def ok(self, value: Any) -> bool:
        tp, b = self.annotation, self._b
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Union:
            return value is None or Rule(_not_none(args), b).ok(value)
        if "fixed" in b:
            return Rule(tp).ok(value) and value == self.default
        if tp is bool:
            return isinstance(value, bool)
        if tp is int:
            return _whole(value) and b["low"] <= value <= b["high"]
        if tp is float:
            return _real(value) and _within(value, b)
        if tp is str:
            return isinstance(value, str) and (value in b["choices"] if "choices" in b else value.strip() != "")
        if origin is tuple:
            return (isinstance(value, list) and len(value) == len(args)
                    and all(_real(v) and _within(v, b) for v in value))
        if origin is list:
            (item,) = args
            if not isinstance(value, list):
                return False
            if item is int:
                return (bool(value) and all(_whole(v) and b["low"] <= v <= b["high"] for v in value)
                        and (not b.get("distinct", True) or len(set(value)) == len(value)))
            if item is Override:
                return all(isinstance(v, str) and v.strip() for v in value)
            if item is Label:
                return all(isinstance(v, str) and v.strip() for v in value) and len(set(value)) == len(value)
            return bool(value) and all(Rule(item).ok(v) for v in value)
        if origin is dict:
            return isinstance(value, dict)
        raise TypeError(f"settings.py declares a setting of a type the check does not know: {tp}")

    def check(self, key: str, value: Any) -> None:
        if not self.ok(value):
            raise refuse(key, value, self.allowed)
        if typing.get_origin(self.annotation) is dict:
            entry = Rule(typing.get_args(self.annotation)[1])
            for label, item in value.items():
                if not isinstance(label, str) or not label.strip():
                    raise refuse(f"{key}.{label}", item, "a label must be a non-empty name")
                entry.check(f"{key}.{label}", item)


def _not_none(args: tuple) -> Any:
    return next(a for a in args if a is not type(None))


@dataclass(frozen=True)
class MethodNode:
    """``algorithm.<key>`` of a method of the catalog: its settings dataclass checks it (its errors name the key;
    an unknown key is refused there too)."""

    method: Any

    @property
    def allowed(self) -> str:
        return f"a mapping of algorithm.{self.method.settings_key}'s settings"

    def check(self, key: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise refuse(key, value, self.allowed)
        self.method.read_settings({self.method.settings_key: value})


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
def _verl_values() -> dict:
    """``verl_reference`` resolved in itself: the values a refusal names."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(verl_reference()), resolve=True)


def _verl_type(key: str, entry: Mapping) -> Any:
    """A verl key's type: the entry's own ``type``, else the annotation in the dataclass its node's ``_target_``
    names, else the type of verl's default (a choice of strings where verl has none)."""
    from hydra.utils import get_class

    if "type" in entry:
        return entry["type"]
    node, name = key.rsplit(".", 1)
    target = _get(verl_reference(), f"{node}._target_")
    hint = typing.get_type_hints(get_class(target)).get(name) if isinstance(target, str) else None
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return Optional[_not_none(typing.get_args(hint))]
    if hint is not None and hint is not Any:
        return hint
    default = _get(verl_reference(), key)
    return str if default is None else type(default)


@functools.lru_cache(maxsize=1)
def setting_rules() -> dict[str, Any]:
    """Every key the testbed reads with what it takes: its own settings (``settings.Testbed``), the methods'
    nodes, and verl's keys (``settings.VERL_KEYS``)."""
    verl = {key: Rule(_verl_type(key, entry), {k: v for k, v in entry.items() if k != "type"},
                      _get(verl_reference(), key)) for key, entry in declared.VERL_KEYS.items()}
    return {**_rules(declared.Testbed, ""), **_method_nodes(), **verl}


@functools.lru_cache(maxsize=None)
def task_rules(task: str) -> dict[str, Any]:
    """``task.<key>`` of the task ``task`` (``settings.TASK_CLASSES``), ``task.name`` first."""
    return _rules(TASK_CLASSES[task], "task.")


@functools.lru_cache(maxsize=1)
def verl_actor_rules() -> dict[str, Rule]:
    """``actor_rollout_ref.actor.<field>`` (and ``.policy_loss.<field>``) for each scalar field of verl's actor
    config (its loss config) that ``VERL_KEYS`` does not name: the testbed passes them on to verl
    (``update.actor_config``) for the registered losses to read, typed as verl declares them."""
    from hydra.utils import get_class

    out: dict[str, Rule] = {}
    for node in (ACTOR_KEY, f"{ACTOR_KEY}.policy_loss"):
        for field in fields(get_class(_get(verl_reference(), f"{node}._target_"))):
            key = f"{node}.{field.name}"
            annotation = _verl_type(key, {})
            scalar = _not_none(typing.get_args(annotation)) if typing.get_origin(annotation) is typing.Union \
                else annotation
            if scalar in (bool, int, float, str) and field.name not in declared.VERL_NOT_SETTABLE \
                    and key not in setting_rules():
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
        value = _get(_verl_values(), key, MISSING)
        if value is not MISSING:
            *parents, last = key.split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
    return out


# --- the check -------------------------------------------------------------------------------------------------

def _get(tree: Any, key: str, default: Any = None) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return default
        tree = tree[part]
    return tree


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
    copies = {key for key in settings if "${" in str(_get(raw, key))}
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
    name = resolve("task.name", _get(raw, "task.name"))
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
        passed_on = verl_actor_rules().get(full) if full.startswith(f"{ACTOR_KEY}.") else None
        if full in settings:
            continue
        if passed_on is not None:
            passed_on.check(full, resolve(full, value))
        elif any(k.startswith(f"{full}.") for k in settings) or (
                isinstance(value, dict) and isinstance(_get(verl_reference(), full), dict)):
            _check_others(value, resolve, full, settings, task)
        elif value != _get(verl_reference(), full, MISSING):
            raise TestbedSettingError(f"{full}={text(value)}: {unknown_setting(full, task)}")


def unknown_setting(key: str, task: Optional[str] = None) -> str:
    """What to say of ``key``, a key the testbed does not read: verl's value where it is verl's, and the keys the
    testbed reads beside it."""
    verls = _get(_verl_values(), key, MISSING)
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


# --- what the recipe's launch refuses ----------------------------------------------------------------------------

class LaunchRefusal(TestbedSettingError):
    """A testbed config that the recipe's launch refuses (a method's ``launch_checks``); the message is the
    launch's one line."""


def launch_of(cfg: Any) -> Any:
    """The ``Launch`` a method's launch checks get for a testbed config: the config (interpolations resolved) as the
    recipe's sync trainer runs it, ``testbed`` true and ``staleness`` its lag (``methods.base.Launch``)."""
    from omegaconf import OmegaConf

    from recipe_apo.methods.base import Launch

    values = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    view = OmegaConf.create({**values, "trainer": {"v1": {"trainer_mode": "sync"}}})
    staleness = values.get("staleness", 0)
    return Launch(view, recipe_trainer=True, verl_mode="sync", testbed=True,
                  staleness=staleness if _whole(staleness) else 0)


def check_launch(cfg: Any) -> None:
    """Refuse, as a ``LaunchRefusal`` in the launch's own line, a testbed config of a method whose run the recipe's
    launch refuses: every active method's launch checks (``@METHOD.launch_check``), run as the launch runs them
    (``launch_of``). A check skips only what the testbed runs on purpose where the recipe cannot
    (``algorithm.zero_variance=exact``; R2PO's model folder: the testbed's policy is its own), and the testbed's
    ``staleness`` counts as the asynchronous mode it stands for where a method's reason holds for it (R2PO: a stale
    round samples from the head of the phase before the switch)."""
    from recipe_apo.methods import catalog

    launch = launch_of(cfg)
    for method in catalog.active(launch.config):
        for check in method.checks():
            try:
                check(launch)
            except RecipeError as exc:
                raise LaunchRefusal(" ".join(str(exc).split())) from None


# --- Hydra's own errors ------------------------------------------------------------------------------------------

def _override_of(key: str, overrides: Sequence[str]) -> Optional[str]:
    """The override among ``overrides`` that sets ``key`` (``+``/``++``/``~`` prefixes allowed), if any."""
    for override in reversed(list(overrides)):
        if override.split("=", 1)[0].lstrip("+~") == key:
            return override
    return None


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _task_of(overrides: Sequence[str]) -> Optional[str]:
    choice = _override_of("task", overrides)
    return choice.split("=", 1)[1] if choice and "=" in choice else None


def _lines(message: str) -> list[str]:
    """A Hydra message's lines without its links and its config search path."""
    out = []
    for line in message.splitlines():
        line = line.strip()
        if line.startswith("Config search path") or line.startswith("provider="):
            break
        if line and not line.startswith("See https://") and line != "^":
            out.append(line)
    return out


def hydra_line(exc: BaseException, overrides: Sequence[str] = ()) -> str:
    """One line for an error Hydra or OmegaConf raised while reading the command line or composing the config
    (``overrides``: the command line, to name the override at fault): ``<override>: <what is wrong>``."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, OverrideParseException):
        reason = " ".join(_lines(str(exc))[:1]) or "a syntax error"
        if reason.startswith("LexerNoViableAltException"):
            reason = "a character Hydra's grammar does not take"
        return (f"{exc.override}: not an override Hydra can read ({reason}); see "
                "https://hydra.cc/docs/advanced/override_grammar/basic/")
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and "/" in exc.missing_cfg_file:
        group, name = exc.missing_cfg_file.rsplit("/", 1)
        if exc.options:
            return f"{group}={name}: no such {group}; one of {', '.join(exc.options)}"
        return f"{group}={name}: no such {group}"
    cause = exc.__cause__ if isinstance(exc.__cause__, OmegaConfBaseException) else None
    source = cause if cause is not None else exc if isinstance(exc, OmegaConfBaseException) else None
    full_key = str(getattr(source, "full_key", "") or "")
    if source is not None and full_key and "not in struct" in str(source):
        said = unknown_setting(full_key, _task_of(overrides))
        override = _override_of(full_key, overrides)
        if override is not None:
            return f"{override}: {said}"
        # A key under a node the testbed's config leaves out (critic.ppo_epochs=3: verl's critic): the override's.
        inner = next((o for o in reversed(list(overrides)) if _key(o).startswith(f"{full_key}.")), None)
        if inner is not None:
            return f"{inner}: {unknown_setting(_key(inner), _task_of(overrides))}"
        # A mapping set whole (policy={a:1}): the override names the node, the message the key inside it.
        node = next((o for o in overrides if full_key.startswith(o.split("=", 1)[0].lstrip("+~") + ".")), None)
        return f"{node}: {full_key} is {said}" if node else f"{full_key}: {said}"
    lines = _lines(str(exc))
    if cause is not None:
        lines += _lines(str(cause))[:1]
    message = " ".join(lines) or type(exc).__name__
    if full_key and full_key not in message:
        message = f"{full_key}: {message}"
    return message
