"""Every testbed setting typed and bounded: what conf/testbed.yaml and conf/task/*.yaml declare, each key with the
values the testbed runs with (``SETTINGS``, ``TASK_SETTINGS``), checked on a composed config by ``check_settings``
before any work starts.

A whole number is an int (``1.5`` is refused, not truncated; so is ``true``, and ``'3'`` is a string), a number is
finite, the seeds are a non-empty list of distinct whole numbers in [0, 2^32 - 1] (what torch's and numpy's
seeding take), a key the testbed does not read is refused (Hydra's ``+task.K=7`` adds one; the message names it
and lists the known ones). ``algorithm.apo``, ``algorithm.codapo`` and ``algorithm.agpo`` are the recipe's own method
settings, checked by their own classes; ``actor_rollout_ref.actor`` also takes the scalar fields of verl's actor config
that the testbed passes on to verl (``+actor_rollout_ref.actor.kl_loss_coef=...``), typed as verl declares them.

Each refusal is a ``TestbedSettingError`` whose message is one line: ``<key>=<value>: <what is allowed>``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

from recipe_apo.testbed.errors import TestbedSettingError

MODES = ("train", "signal", "league")
TASKS = ("reverse", "modsum")
# algorithm.zero_variance in the testbed: the recipe's two, and the exact reference the recipe cannot run.
ZERO_VARIANCE_MODES = ("keep", "exclude", "exact")
# The per-run metrics of summary.json that the report pairs over seeds (report.PAIRED); league.metric is one.
PAIRED_METRICS = ("success_avg", "success_early", "success_final", "hard_success_avg", "hard_success_final",
                  "fillers_correct", "fillers_incorrect", "len_correct", "len_incorrect", "cut_share")
# torch.manual_seed and numpy's seeding take 0 .. 2^32 - 1 everywhere; the testbed's streams stay far inside
# torch's 64 bits (1_000_003 * seed + ...).
SEED_MAX = 2**32 - 1
# Nodes that a command line may leave out (``~league.extra``, ``~league.variant_of``).
OPTIONAL = ("league.extra", "league.variant_of")


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


# --- kinds of value ------------------------------------------------------------------------------------------

def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Kind:
    """What a setting takes: ``ok(value)``, and ``allowed``, said when it is refused."""

    allowed = ""

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def check(self, key: str, value: Any) -> None:
        if not self.ok(value):
            raise refuse(key, value, self.allowed)


class Whole(Kind):
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self.allowed = f"a whole number in [{low}, {high}]"

    def ok(self, value: Any) -> bool:
        return _whole(value) and self.low <= value <= self.high


class Real(Kind):
    def __init__(self, low: Optional[float] = None, high: Optional[float] = None, low_open: bool = False,
                 high_open: bool = False) -> None:
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open
        if low is None and high is None:
            self.allowed = "a finite number"
        else:
            span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            self.allowed = f"a finite number in {span}"

    def ok(self, value: Any) -> bool:
        if not _real(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


class Flag(Kind):
    allowed = "true or false"

    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)


class OneOf(Kind):
    def __init__(self, options: Sequence[str]) -> None:
        self.options = tuple(options)
        self.allowed = f"one of {', '.join(self.options)}"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options


class Text(Kind):
    allowed = "a non-empty string"

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value.strip() != ""


class Fixed(Kind):
    """A setting verl declares that the testbed cannot honour other than at one value."""

    def __init__(self, kind: Kind, value: Any, why: str) -> None:
        self.kind, self.value = kind, value
        self.allowed = f"must be {text(value)}: {why}"

    def ok(self, value: Any) -> bool:
        return self.kind.ok(value) and value == self.value


class Maybe(Kind):
    """null, or a value of ``kind``."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.allowed = f"null or {kind.allowed}"

    def ok(self, value: Any) -> bool:
        return value is None or self.kind.ok(value)


class Wholes(Kind):
    """A list of whole numbers in [low, high]."""

    def __init__(self, low: int, high: int, example: str, distinct: bool = True) -> None:
        self.low, self.high, self.distinct = low, high, distinct
        self.allowed = (f"a non-empty list of {'distinct ' if distinct else ''}whole numbers in [{low}, {high}], "
                        f"e.g. {example}")

    def ok(self, value: Any) -> bool:
        if not isinstance(value, list) or not value:
            return False
        if not all(_whole(v) and self.low <= v <= self.high for v in value):
            return False
        return not self.distinct or len(set(value)) == len(value)


class Betas(Kind):
    allowed = "a list of two finite numbers in [0, 1), e.g. [0.9,0.999]"

    def ok(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) == 2 and all(_real(v) and 0 <= v < 1 for v in value)


class Overrides(Kind):
    """A list of Hydra overrides, as a method's entry or a scenario holds them."""

    def __init__(self, example: str = "[method=grpo,actor_rollout_ref.actor.policy_loss.loss_mode=sapo]") -> None:
        self.allowed = f"a list of overrides, e.g. {example}"

    def ok(self, value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) and v.strip() for v in value)


class Labels(Kind):
    def __init__(self, what: str, example: str, empty: bool = True) -> None:
        self.empty = empty
        self.allowed = f"a {'' if empty else 'non-empty '}list of {what}, e.g. {example}"

    def ok(self, value: Any) -> bool:
        return (isinstance(value, list) and (self.empty or bool(value))
                and all(isinstance(v, str) and v.strip() for v in value) and len(set(value)) == len(value))


class Scenarios(Kind):
    allowed = "a non-empty list of override lists, e.g. [[],[task.max_len=6],[scenario=stale]]"

    def ok(self, value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(Overrides().ok(v) for v in value)


class LabelMap(Kind):
    """label -> a value of ``kind`` (``methods``, ``league.extra``, ``league.variants``, ``league.variant_of``)."""

    def __init__(self, kind: Kind, example: str) -> None:
        self.kind = kind
        self.allowed = f"a mapping of label -> {kind.allowed.split(', e.g.')[0]}, e.g. {example}"

    def ok(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, key: str, value: Any) -> None:
        super().check(key, value)
        for label, entry in value.items():
            if not isinstance(label, str) or not label.strip():
                raise refuse(f"{key}.{label}", entry, "a label must be a non-empty name")
            self.kind.check(f"{key}.{label}", entry)


class MethodSettings(Kind):
    """``algorithm.<key>`` of a method of the catalog: its settings dataclass checks it (its errors name the key; an
    unknown key is refused there too)."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.allowed = f"a mapping of algorithm.{method.settings_key}'s settings"

    def ok(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, key: str, value: Any) -> None:
        super().check(key, value)
        self.method.read_settings({self.method.settings_key: value})


def _method_settings() -> dict[str, Kind]:
    """``algorithm.<key>`` for every method of the catalog that has settings."""
    from recipe_apo.methods import catalog

    return {f"algorithm.{m.settings_key}": MethodSettings(m) for m in catalog.methods() if m.settings is not None}


_OVERRIDES = Overrides()
ACTOR = "actor_rollout_ref.actor"

# Every key of conf/testbed.yaml, in its order, with what it takes (the task's keys: TASK_SETTINGS).
SETTINGS: dict[str, Kind] = {
    "mode": OneOf(MODES),
    "league.methods": Labels("labels of methods", "[grpo,apo]"),
    "league.extra": LabelMap(_OVERRIDES, "+league.extra.apo_x=[method=apo,algorithm.apo.eta=0.5]"),
    "league.variants": LabelMap(_OVERRIDES, "league.variants.zv=[algorithm.zero_variance=exclude]"),
    "league.variant_of": LabelMap(Labels("labels", "[grpo,apo]"), "league.variant_of.zv=[grpo,apo]"),
    "league.scenarios": Scenarios(),
    "league.metric": OneOf(PAIRED_METRICS),
    "methods": LabelMap(_OVERRIDES, "+methods.sapo=[method=grpo,actor_rollout_ref.actor.policy_loss.loss_mode=sapo]"),
    "seeds": Wholes(0, SEED_MAX, "[0,1,2,3]"),
    "workers": Whole(1, 256),
    "threads_per_worker": Whole(1, 256),
    "scenario_name": Text(),
    "rounds": Whole(1, 100_000),
    "eval_every": Whole(1, 100_000),
    "early_fraction": Real(0, 1, low_open=True),
    "staleness": Whole(0, 1000),
    "rollout_n_multiplier": Whole(1, 64),
    "policy.embed_dim": Whole(1, 4096),
    "policy.hidden_dim": Whole(1, 4096),
    "policy.layers": Whole(1, 16),
    "pretrain.steps": Whole(0, 1_000_000),
    "pretrain.batch_size": Whole(1, 65_536),
    "pretrain.lr": Real(0, 10, low_open=True),
    "eval.prompts_per_length": Whole(1, 10_000),
    "eval.samples": Whole(1, 10_000),
    "eval.bucket_samples": Whole(1, 10_000),
    "data.train_batch_size": Whole(1, 65_536),
    "data.max_response_length": Whole(2, 10_000),
    **_method_settings(),
    "algorithm.adv_estimator": Text(),
    "algorithm.norm_adv_by_std_in_grpo": Flag(),
    "algorithm.gamma": Real(0, 1),
    "algorithm.lam": Real(0, 1),
    "algorithm.use_kl_in_reward": Fixed(Flag(), False, "the testbed has no KL penalty in the reward (its KL is "
                                                       "the actor's KL loss, actor_rollout_ref.actor.use_kl_loss)"),
    "algorithm.zero_variance": OneOf(ZERO_VARIANCE_MODES),
    "actor_rollout_ref.rollout.n": Whole(2, 1024),
    "actor_rollout_ref.rollout.temperature": Real(0, 100, low_open=True),
    f"{ACTOR}.ppo_mini_batch_size": Whole(1, 65_536),
    f"{ACTOR}.ppo_micro_batch_size_per_gpu": Maybe(Whole(1, 10_000_000)),
    f"{ACTOR}.ppo_epochs": Whole(1, 1000),
    f"{ACTOR}.shuffle": Flag(),
    f"{ACTOR}.grad_clip": Real(0, 1e9, low_open=True),
    f"{ACTOR}.optim.lr": Real(0, 10),
    f"{ACTOR}.optim.betas": Betas(),
    f"{ACTOR}.optim.weight_decay": Real(0, 100),
    f"{ACTOR}.policy_loss.loss_mode": Text(),
    # verl 0.9.1's (FSDPActorConfig.__post_init__).
    f"{ACTOR}.loss_agg_mode": OneOf(("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                     "seq-mean-token-sum-norm")),
    f"{ACTOR}.loss_scale_factor": Maybe(Real(0, 1e9, low_open=True)),
    f"{ACTOR}.clip_ratio": Real(0, 100, low_open=True),
    f"{ACTOR}.clip_ratio_low": Real(0, 100, low_open=True),
    f"{ACTOR}.clip_ratio_high": Real(0, 100, low_open=True),
    # AGPO (method=agpo_dual) turns the dual clip off with 1e9, a bound no ratio reaches.
    f"{ACTOR}.clip_ratio_c": Real(1, 1e12, low_open=True),
    f"{ACTOR}.tau_pos": Real(0, 1000, low_open=True),
    f"{ACTOR}.tau_neg": Real(0, 1000, low_open=True),
    f"{ACTOR}.entropy_coeff": Fixed(Real(), 0, "the testbed has no entropy bonus"),
    f"{ACTOR}.use_kl_loss": Flag(),
    "signal.group_sizes": Wholes(2, 1024, "[4,8,16]"),
    "signal.p_points": Whole(2, 1001),
    "signal.groups": Whole(1, 100_000),
    "signal.anchor": Real(0, 1),
    "signal.seed": Whole(0, SEED_MAX),
}

# Each task's keys (conf/task/<name>.yaml), ``task.name`` first.
TASK_SETTINGS: dict[str, dict[str, Kind]] = {
    "reverse": {
        "task.name": OneOf(TASKS),
        "task.alphabet": Whole(2, 1000),
        "task.min_len": Whole(1, 100),
        "task.max_len": Whole(1, 100),
        "task.filler_mean": Real(0, 100),
    },
    "modsum": {
        "task.name": OneOf(TASKS),
        "task.moduli": Wholes(2, 1000, "[2,4,8,16,32]"),
        "task.prefix_max": Whole(0, 100),
        "task.filler_mean": Real(0, 100),
    },
}

# Nested or runtime-only fields of verl's actor config that the testbed does not take from its yaml
# (update.actor_config), and, beside them, what no command line sets (a class path, verl's rollout correction).
VERL_NOT_FROM_YAML = {"policy_loss", "optim", "checkpoint", "fsdp_config", "profiler", "engine", "model_config",
                      "qat", "global_batch_info", "strategy", "rollout_n", "router_replay", "megatron"}
_VERL_NOT_SETTABLE = VERL_NOT_FROM_YAML | {"_target_", "rollout_correction"}


def _verl_kind(annotation: Any) -> Optional[Kind]:
    """The kind of a scalar field of verl's actor config, from its annotation; None for anything else."""
    name = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    name = name.replace("typing.", "")
    maybe = name.startswith("Optional[")
    base = name.removeprefix("Optional[").removesuffix("]") if maybe else name
    kind = {"bool": Flag(), "int": Whole(0, 2**31 - 1), "float": Real(), "str": Text()}.get(base)
    if kind is None:
        return None
    return Maybe(kind) if maybe else kind


@functools.lru_cache(maxsize=1)
def verl_actor_settings() -> dict[str, Kind]:
    """``actor_rollout_ref.actor.<field>`` (and ``.policy_loss.<field>``) for each scalar field of verl's
    ``FSDPActorConfig`` (``PolicyLossConfig``) that conf/testbed.yaml does not declare: the testbed passes them on
    to verl (``update.actor_config``), typed as verl declares them."""
    import dataclasses

    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    out: dict[str, Kind] = {}
    for prefix, cls in ((ACTOR, FSDPActorConfig), (f"{ACTOR}.policy_loss", PolicyLossConfig)):
        for field in dataclasses.fields(cls):
            key = f"{prefix}.{field.name}"
            kind = None if field.name in _VERL_NOT_SETTABLE else _verl_kind(field.type)
            if kind is not None and key not in SETTINGS:
                out[key] = kind
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
    kind = SETTINGS.get(key) or next((t[key] for t in TASK_SETTINGS.values() if key in t), None)
    return kind.allowed if kind is not None else "a value"


def _children(settings: dict[str, Kind], node: str) -> list[str]:
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
        OneOf(TASKS).check("task.name", name)
    settings = {**SETTINGS, **TASK_SETTINGS.get(name, TASK_SETTINGS["reverse"])}
    _check_node(values, "", settings, name)
    return values


def _check_node(node: dict, path: str, settings: dict[str, Kind], task: Optional[str]) -> None:
    for key, value in node.items():
        full = f"{path}.{key}" if path else str(key)
        kind = settings.get(full)
        if kind is None and full.startswith(f"{ACTOR}.") and full.count(".") <= 3:
            kind = verl_actor_settings().get(full)
        if kind is not None:
            kind.check(full, value)
        elif any(k.startswith(f"{full}.") for k in settings):
            if not isinstance(value, dict):
                raise refuse(full, value, f"a mapping of {full}'s settings: {', '.join(_children(settings, full))}")
            _check_node(value, full, settings, task)
        else:
            raise TestbedSettingError(f"{full}={text(value)}: {unknown_setting(full, task)}")
    for key in _children(settings, path):
        full = f"{path}.{key}" if path else key
        if key not in node and full not in OPTIONAL:
            kind = settings.get(full)
            what = kind.allowed if kind is not None else f"the settings {', '.join(_children(settings, full))}"
            raise TestbedSettingError(f"{full}: missing (deleted with ~{full}?); the testbed needs it: {what}")


def unknown_setting(key: str, task: Optional[str] = None) -> str:
    """What to say of ``key``, a key the testbed does not read: the known keys beside it."""
    settings = {**SETTINGS, **TASK_SETTINGS.get(task or "reverse", TASK_SETTINGS["reverse"])}
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    while parent and not any(k.startswith(f"{parent}.") for k in settings):
        parent = parent.rsplit(".", 1)[0] if "." in parent else ""
    known = _children(settings, parent)
    if parent in (ACTOR, f"{ACTOR}.policy_loss"):
        known += [k.rsplit(".", 1)[1] for k in verl_actor_settings() if k.rsplit(".", 1)[0] == parent]
    where = {"": "the testbed's settings", "task": f"task={task or 'reverse'}'s settings"}.get(
        parent, f"{parent}'s settings")
    other = [t for t, keys in TASK_SETTINGS.items() if t != (task or "reverse") and key in keys]
    also = f" ({key} is task={other[0]}'s)" if other else ""
    return f"not a setting the testbed reads{also}; {where}: {', '.join(known)}"


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
