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
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, Mapping, Optional, Sequence

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
    """key -> Rule for every field of the settings dataclass ``cls`` and of the dataclasses it nests, in their
    order (``algorithm``'s method nodes first, as ``method_settings`` composes them)."""
    hints = typing.get_type_hints(cls, vars(declared))
    out: dict[str, Any] = {}
    if prefix == "algorithm.":
        out.update(_method_nodes())
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
    """Every key of the testbed's settings (``settings.Testbed``) with what it takes."""
    return _rules(declared.Testbed, "")


@functools.lru_cache(maxsize=None)
def task_rules(task: str) -> dict[str, Any]:
    """``task.<key>`` of the task ``task`` (``settings.TASK_CLASSES``), ``task.name`` first."""
    return _rules(TASK_CLASSES[task], "task.")


def _verl_rule(annotation: Any) -> Optional[Rule]:
    """What a scalar field of verl's actor config takes, from its annotation; None for anything else."""
    name = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    name = name.replace("typing.", "")
    maybe = name.startswith("Optional[")
    base = name.removeprefix("Optional[").removesuffix("]") if maybe else name
    types = {"bool": bool, "int": int, "float": float, "str": str}
    if base not in types:
        return None
    bounds = {"low": 0, "high": 2**31 - 1} if base == "int" else {}
    return Rule(Optional[types[base]] if maybe else types[base], bounds)


@functools.lru_cache(maxsize=1)
def verl_actor_rules() -> dict[str, Rule]:
    """``actor_rollout_ref.actor.<field>`` (and ``.policy_loss.<field>``) for each scalar field of verl's
    ``FSDPActorConfig`` (``PolicyLossConfig``) that settings.py does not declare: the testbed passes them on to
    verl (``update.actor_config``), typed as verl declares them."""
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    out: dict[str, Rule] = {}
    for prefix, cls in ((ACTOR_KEY, FSDPActorConfig), (f"{ACTOR_KEY}.policy_loss", PolicyLossConfig)):
        for field in fields(cls):
            key = f"{prefix}.{field.name}"
            rule = None if field.name in declared.VERL_NOT_SETTABLE else _verl_rule(field.type)
            if rule is not None and key not in setting_rules():
                out[key] = rule
    return out


# --- the check -------------------------------------------------------------------------------------------------

def plain(cfg: Any) -> dict:
    """The config as plain values, interpolations resolved: one that does not resolve, or a ``???`` left
    unset, is refused naming its key."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    if not isinstance(cfg, DictConfig):
        return cfg
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        key = str(getattr(exc, "full_key", "") or "?")
        raise TestbedSettingError(f"{key}=???: not set; {_allowed(key)}") from None
    except OmegaConfBaseException as exc:
        key = str(getattr(exc, "full_key", "") or "?")
        value = _get(OmegaConf.to_container(cfg, resolve=False), key)
        reason = " ".join(str(exc).split("\n")[0].split())
        raise TestbedSettingError(f"{key}={text(value)}: does not resolve ({reason})") from None


def _get(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _allowed(key: str) -> str:
    rule = setting_rules().get(key) or next((task_rules(t)[key] for t in TASKS if key in task_rules(t)), None)
    return rule.allowed if rule is not None else "a value"


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


def check_settings(cfg: Any) -> dict:
    """Refuse, with one line naming the key, any setting of a composed testbed config (``cfg``: a DictConfig or
    its plain dict) that the testbed does not read, or that is of the wrong type or out of bounds; returns the
    plain config. No relation between settings is checked here (``min_len <= max_len``: the task's own check)."""
    values = plain(cfg)
    if not isinstance(values, dict):
        raise TestbedSettingError(f"the testbed's config must be a mapping, got {text(values)}")
    task = values.get("task")
    name = task.get("name") if isinstance(task, dict) else None
    if isinstance(task, dict):
        Rule(str, {"choices": TASKS}).check("task.name", name)
    settings = {**setting_rules(), **task_rules(name if name in TASKS else "reverse")}
    _check_node(values, "", settings, name)
    return values


def _check_node(node: dict, path: str, settings: dict[str, Any], task: Optional[str]) -> None:
    for key, value in node.items():
        full = f"{path}.{key}" if path else str(key)
        rule = settings.get(full)
        if rule is None and full.startswith(f"{ACTOR_KEY}.") and full.count(".") <= 3:
            rule = verl_actor_rules().get(full)
        if rule is not None:
            rule.check(full, value)
        elif any(k.startswith(f"{full}.") for k in settings):
            if not isinstance(value, dict):
                raise refuse(full, value, f"a mapping of {full}'s settings: {', '.join(_children(settings, full))}")
            _check_node(value, full, settings, task)
        else:
            raise TestbedSettingError(f"{full}={text(value)}: {unknown_setting(full, task)}")
    for key in _children(settings, path):
        full = f"{path}.{key}" if path else key
        if key not in node and full not in OPTIONAL:
            rule = settings.get(full)
            what = rule.allowed if rule is not None else f"the settings {', '.join(_children(settings, full))}"
            raise TestbedSettingError(f"{full}: missing (deleted with ~{full}?); the testbed needs it: {what}")


def unknown_setting(key: str, task: Optional[str] = None) -> str:
    """What to say of ``key``, a key the testbed does not read: the known keys beside it."""
    settings = {**setting_rules(), **task_rules(task if task in TASKS else "reverse")}
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    while parent and not any(k.startswith(f"{parent}.") for k in settings):
        parent = parent.rsplit(".", 1)[0] if "." in parent else ""
    known = _children(settings, parent)
    if parent in (ACTOR_KEY, f"{ACTOR_KEY}.policy_loss"):
        known += [k.rsplit(".", 1)[1] for k in verl_actor_rules() if k.rsplit(".", 1)[0] == parent]
    where = {"": "the testbed's settings", "task": f"task={task or 'reverse'}'s settings"}.get(
        parent, f"{parent}'s settings")
    other = [t for t in TASKS if t != (task or "reverse") and key in task_rules(t)]
    also = f" ({key} is task={other[0]}'s)" if other else ""
    return f"not a setting the testbed reads{also}; {where}: {', '.join(known)}"


# --- what the recipe's launch refuses ----------------------------------------------------------------------------

class LaunchRefusal(TestbedSettingError):
    """A testbed config that the recipe's launch refuses (a method's ``launch_checks``); the message is the
    launch's one line."""


def launch_of(cfg: Any) -> Any:
    """The ``Launch`` a method's launch checks get for a testbed config: the config (interpolations resolved) as the
    recipe's sync trainer runs it, ``testbed`` true and ``staleness`` its lag (``methods.base.Launch``)."""
    from omegaconf import OmegaConf

    from recipe_apo.methods.base import Launch

    values = plain(cfg)
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
