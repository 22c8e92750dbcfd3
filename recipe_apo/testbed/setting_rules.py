"""What one setting takes and how a refusal reads: ``Rule`` (a setting's type and bounds, read from its declaration:
an annotation and ``setting(...)``'s metadata, or verl's annotation and ``settings.VERL_KEYS``'s entry),
``MethodNode`` (a method's ``algorithm.<key>``, checked by its own settings class), and ``refuse``, the one line
``<key>=<value>: <what is allowed>``.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.settings import Label, Override


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

def whole(value: Any) -> bool:
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
            return f"null or {Rule(not_none(args), b).allowed}"
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
            return value is None or Rule(not_none(args), b).ok(value)
        if "fixed" in b:
            return Rule(tp).ok(value) and value == self.default
        if tp is bool:
            return isinstance(value, bool)
        if tp is int:
            return whole(value) and b["low"] <= value <= b["high"]
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
                return (bool(value) and all(whole(v) and b["low"] <= v <= b["high"] for v in value)
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


def not_none(args: tuple) -> Any:
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


def value_at(tree: Any, key: str, default: Any = None) -> Any:
    """The value at the dotted ``key`` of a plain tree, ``default`` where there is none."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return default
        tree = tree[part]
    return tree
