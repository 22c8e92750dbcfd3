"""The method presets, ``conf/method/*.yaml``: the one list of the recipe's methods.

Every part of the recipe that lists methods reads it here: ``python -m recipe_apo`` (the demo batch), the CPU
rehearsal's default and ``--methods``, the bias audit's replayed methods, the CPU testbed's default ``methods``
and ``league.methods`` (``scripts/lib/recipe_launch.sh`` lists the same files from bash). A new file in
``conf/method/`` is a new method everywhere.

**Order and title.** Each preset file may declare, on a comment line of its leading comment block, after Hydra's
``# @package _global_`` line::

    # @package _global_
    # preset: {order: 2, title: Dr. GRPO}

a YAML flow mapping read by this module only: Hydra and verl see a comment, so the composed config does not
change. ``order`` (a number) places the preset in every list of methods (ascending); ``title`` is the name the
reports print (default: the title of the method whose declaration names the preset, ``Method.presets``, else the
file's name). A file without the line is a preset too; it comes after the ordered ones, by file name. The line
must not start with ``# @`` (Hydra reads such lines as its own header, and refuses a value with spaces) and must
come after ``# @package`` (Hydra's header ends at the first other line, so a ``# @package`` below it would be
ignored and the preset's keys would land under ``method.``).

The names need no Hydra (``importlib.resources`` reads the package's files). ``settings(name)`` composes the
recipe's config (``apo_trainer``) with ``method=<name>`` and returns the settings that define the method.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Optional, Sequence

from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.methods import catalog

CONFIG_PACKAGE, GROUP = "recipe_apo.conf", "method"
RECIPE_CONFIG = "apo_trainer"
_DECLARATION = re.compile(r"^#\s*preset:(?P<body>.*)$")
_HYDRA_HEADER = re.compile(r"^#\s*@")
_FIELDS = ("order", "title")


class PresetError(RecipeConfigError):
    """A preset file's ``# preset:`` line cannot be read; the message names the file."""


@dataclass(frozen=True)
class Preset:
    """One file of ``conf/method/``: ``method=<name>``, its title in reports, its declared order (None: none)."""

    name: str
    title: str
    order: Optional[float] = None

    def settings(self) -> "MethodSettings":
        return settings(self.name)


@dataclass(frozen=True)
class MethodSettings:
    """The settings that define a method, as the recipe composes its preset."""

    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    loss_mode: str
    loss_agg_mode: str
    # The active methods (``recipe_apo.methods.catalog``) that change the advantages beyond the estimator's.
    advantage_methods: tuple[str, ...] = ()
    # What the estimator reads beyond a batch's rewards, mask and uids (None: nothing; ``Estimator.needs``).
    needs: Optional[str] = None

    @classmethod
    def of(cls, config: Any) -> "MethodSettings":
        """The settings of a composed recipe config (``compose``'s)."""
        actor = config.actor_rollout_ref.actor
        active = catalog.active(config)
        estimator = str(config.algorithm.adv_estimator)
        needs = next((m.estimator_needs(estimator) for m in active if estimator in m.estimators), None)
        return cls(
            adv_estimator=estimator,
            norm_adv_by_std_in_grpo=bool(config.algorithm.norm_adv_by_std_in_grpo),
            loss_mode=str(actor.policy_loss.loss_mode),
            loss_agg_mode=str(actor.loss_agg_mode),
            advantage_methods=tuple(m.name for m in active if m.changes_advantages and estimator not in m.estimators),
            needs=needs,
        )

    @property
    def advantages(self) -> tuple:
        """What decides the advantages on a batch: two presets alike here give the same advantages to the last bit
        (verl's ``grpo`` reads ``norm_adv_by_std_in_grpo``; the recipe's estimators read their own settings)."""
        return (self.adv_estimator, self.norm_adv_by_std_in_grpo, self.advantage_methods)


def _directory():
    """The preset files' folder, as a Traversable of the installed package."""
    return resources.files(CONFIG_PACKAGE) / GROUP


def parse_declaration(text: str, where: str = "preset") -> dict[str, Any]:
    """``order`` and ``title`` of a preset file's ``# preset:`` line (empty when it has none)."""
    body, seen_other = None, False
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break  # the leading comment block ends at the first YAML line
        if _HYDRA_HEADER.match(line):
            if seen_other and re.match(r"^#\s*@package\b", line):
                raise PresetError(f"{where}: '# @package' must be the first line (Hydra reads its header only up to "
                                  "the first other comment line)")
            continue
        seen_other = True
        match = _DECLARATION.match(line)
        if match and body is None:
            body = match.group("body")
    return {} if body is None else _fields(body, where)


def _fields(body: str, where: str) -> dict[str, Any]:
    import yaml

    try:
        fields = yaml.safe_load(body)
    except yaml.YAMLError as exc:
        raise PresetError(f"{where}: the '# preset:' line is not a YAML mapping ({exc})") from None
    if not isinstance(fields, dict) or set(fields) - set(_FIELDS):
        raise PresetError(f"{where}: the '# preset:' line must be a mapping of {', '.join(_FIELDS)}, e.g. "
                          f"'# preset: {{order: 2, title: Dr. GRPO}}', got {body.strip()!r}")
    order = fields.get("order")
    if order is not None and (isinstance(order, bool) or not isinstance(order, (int, float))
                              or not math.isfinite(order)):
        raise PresetError(f"{where}: order must be a number, got {order!r}")
    title = fields.get("title")
    if title is not None and (not isinstance(title, str) or not title.strip()):
        raise PresetError(f"{where}: title must be a non-empty string, got {title!r}")
    return {key: fields[key] for key in _FIELDS if fields.get(key) is not None}


def presets() -> tuple[Preset, ...]:
    """Every preset of ``conf/method/``: those with an order by it, then the others; ties by name."""
    found = []
    for entry in _directory().iterdir():
        if not entry.name.endswith(".yaml") or entry.name.startswith("."):
            continue
        name = entry.name[: -len(".yaml")]
        declared = parse_declaration(entry.read_text(encoding="utf-8"), f"conf/method/{entry.name}")
        title = declared.get("title") or next((m.title for m in catalog.of_preset(name)), name)
        found.append(Preset(name, str(title), declared.get("order")))
    return tuple(sorted(found, key=lambda p: (p.order is None, p.order or 0, p.name)))


def names() -> tuple[str, ...]:
    """The presets' names (``method=<name>``), in order."""
    return tuple(p.name for p in presets())


def preset(name: str) -> Preset:
    for candidate in presets():
        if candidate.name == name:
            return candidate
    raise KeyError(f"no method preset {name!r} in conf/method/; presets: {', '.join(names())}")


def compose(name: str, overrides: Sequence[str] = ()) -> Any:
    """The recipe's config (``apo_trainer``, what ``python -m recipe_apo.main`` composes) with ``method=<name>``
    and ``overrides``, not resolved. Inside a running Hydra app or ``initialize()`` block whose search path has the
    recipe's config (the testbed's), it composes there; otherwise in a Hydra context of its own, and leaves the
    caller's Hydra state as it found it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module, version
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException

    request = [f"method={name}", *overrides]
    if GlobalHydra.instance().is_initialized():
        try:
            return hydra_compose(config_name=RECIPE_CONFIG, overrides=request)
        except MissingConfigException:
            pass  # another app's search path, or no such preset: compose on the recipe's own, which says which
    saved = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    base = version.VersionBase.instance()
    saved_base = base.version_base
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="recipe_apo.conf", version_base=None):
            return hydra_compose(config_name=RECIPE_CONFIG, overrides=request)
    finally:
        base.version_base = saved_base
        if saved is not None:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(saved)


@functools.lru_cache(maxsize=None)
def settings(name: str) -> MethodSettings:
    """The method-defining settings of preset ``name``, as the recipe composes it."""
    return MethodSettings.of(compose(name))
