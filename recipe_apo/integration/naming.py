"""How a run is named: ``trainer.experiment_name`` when the user has not set it.

One rule for every entry point. ``python -m recipe_apo.main`` names a job from its Hydra overrides; the launch
scripts in ``scripts/`` pass their settings as overrides too, ahead of the user's, and say how many with
``run_name.script_overrides``, so the same rule names their runs.

The name is the method and every override that changes what is trained, e.g. ``apo-apo.eta=0.5-rollout.n=8``:
deterministic, so rerunning a command resumes its own checkpoints (verl's ``resume_mode=auto``), and distinct
whenever two runs train differently, so no run resumes another's. What counts:

- every override except where things are and how they are logged: ``trainer.*`` (but for ``trainer.v1.*``, the
  trainer mode and its asynchrony settings, the default synchronous mode excepted), ``hydra.*``, ``ray_kwargs.*``,
  ``data.val_files``, the rollout engine's name, the recipe's own switches (``method``, ``dry_run``,
  ``run_name.*``);
- each by the value the config holds for it, interpolations resolved (``${oc.env:DATA}/train.parquet`` counts
  as the path it names), so spellings Hydra reads alike name a run alike (``trainer.v1.trainer_mode='sync'`` is
  the default mode; ``lr=1e-6`` and ``lr=1e-06`` are one run), and a quoted ``'1e-6'``, a string, is another
  run than the number;
- the training data (``data.train_files``, one file or a list) and the model (``actor_rollout_ref.model.path``)
  by their file names in the readable part (``train_files=train.parquet``, ``model=Qwen2.5-Math-1.5B``), and by
  their full paths in the hash the name then ends in: ``/data/v1/train.parquet`` and ``/data/v2/train.parquet``
  are different data, so moving the data (or the model) starts another run.

In a Hydra multirun, a swept key comes first, and is spelled out even where it does not change what is trained
(``trainer.n_gpus_per_node=4,8``, ``trainer.total_training_steps=100,200``): jobs of one sweep that shared a name
would share a checkpoint folder, and the second would resume the first. Before its first job starts, a sweep
whose jobs would still share a checkpoint folder (a value swept twice, ``method=apo,apo``; one
``trainer.experiment_name`` or ``trainer.default_local_dir`` for every job) is refused with one line naming the
jobs and the folder (``check_the_sweep``).

A script's own settings (the first ``run_name.script_overrides`` overrides) would spell out the whole script, so
they count through a hash at the end of the name; the user's overrides are spelled out after
``run_name.prefix`` and the method (``qwen2.5-math-1.5b-apo-data.max_response_length=2048-1f0c2d3e``). The hash
covers everything that counts (the script's settings, the user's, the full model and data paths), and also ends
a name whose readable part lost something (a model or data file shown by its name only, characters replaced by
``_``) or that is longer than 96 characters (then cut).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from recipe_apo.integration.errors import RecipeConfigError

# Overrides that say where things are or how they are logged, not what is trained.
# Validation (its files and its sampling, val_kwargs) does not change what is trained: more validation samples on a
# resumed run stay that run.
LOCATION_KEYS = ("method", "dry_run", "run_name.", "data.val_files", "actor_rollout_ref.rollout.val_kwargs.",
                 "trainer.", "ray_kwargs.", "hydra.", "actor_rollout_ref.rollout.name", "rollout_watch.")
# trainer.* is plumbing, but for verl's V1 trainer settings: an asynchronous mode trains on staler responses.
TRAINED_TRAINER_KEYS = ("trainer.v1.",)
SYNC_MODES = ("sync", "apo_sync")
MODEL_PATH = "actor_rollout_ref.model.path"
TRAIN_FILES = "data.train_files"
# Keys that shape the name by themselves, swept or not.
_NAMED_KEYS = ("method", "run_name.")
# Shortened in the name; ordered first, so that a cut name still shows what a sweep varies.
_PREFIXES = (("algorithm.", ""), ("actor_rollout_ref.actor.", "actor."), ("actor_rollout_ref.", ""), ("data.", "data."))
MAX_NAME_LEN = 96
_HASH_LEN = 8


class _NotInConfig:
    def __repr__(self) -> str:
        return "NOT_IN_CONFIG"


# What ``value_of`` answers for a key the config holds no value for (a config group's choice, a deleted key, an
# interpolation that does not resolve): the override's own value counts instead.
NOT_IN_CONFIG: Any = _NotInConfig()
ValueOf = Callable[[str], Any]


def _short(key: str) -> tuple[int, str]:
    for rank, (prefix, short) in enumerate(_PREFIXES):
        if key.startswith(prefix):
            return rank, short + key[len(prefix):]
    return len(_PREFIXES), key


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@functools.lru_cache(maxsize=4096)
def _parse(override: str):
    return _parser().parse_overrides([override])[0]


def _key(override: str) -> str:
    return _parse(override).get_key_element().lstrip("+~")


@functools.lru_cache(maxsize=4096)
def _reads_back(text: str, value: str) -> bool:
    """Whether Hydra reads ``key=<text>`` as the string ``value`` (not a number, a bool, a list or a sweep)."""
    try:
        parsed = _parse(f"k={text}")
    except Exception:  # Hydra's parser refuses it unquoted
        return False
    return not parsed.is_sweep_override() and parsed.value() == value and isinstance(parsed.value(), str)


def value_text(value: Any) -> str:
    """A value as an override would say it (``1e-06``, ``False``, ``[console,file]``, ``null``): a string that
    Hydra would read as something else unquoted keeps its quotes (``'1e-6'`` is a string, ``1e-06`` a number), so
    two values that train differently never read alike."""
    if isinstance(value, str):
        from hydra._internal.grammar.utils import escape_special_characters
        from hydra.core.override_parser.types import Quote, QuotedString

        for text in (value, escape_special_characters(value)):
            if _reads_back(text, value):
                return text
        return QuotedString(text=value, quote=Quote.single).with_quotes()
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_text(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{value_text(k)}:{value_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def _data_files(value: Any) -> Optional[tuple[str, str, bool]]:
    """(file names, the full paths as they count in the hash, whether the names lost a folder) of
    ``data.train_files``: one path or a list of them (verl reads one path as a list of one)."""
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, (list, tuple)) or not paths or not all(isinstance(path, str) for path in paths):
        return None
    paths = [path.rstrip("/") or path for path in paths]
    names = [path.rsplit("/", 1)[-1] for path in paths]
    return ",".join(names), value_text(paths), names != paths


# (rank, text in the name, what counts in the hash, whether the text lost part of the value)
_Item = tuple[int, str, str, bool]


def training_item(override: str, value: Any = NOT_IN_CONFIG) -> Optional[tuple[str, int, str, str, bool]]:
    """``(key, rank, text in the name, what counts in the hash, lossy)`` of one override, or None when it does
    not change what is trained. ``value``: what the config holds for the key, interpolations resolved (by default
    the override's own value, quotes removed). The model and the training data are named by their file names and
    count by their full paths in the hash (``lossy``: the name then ends in the hash)."""
    parsed = _parse(override)
    key = parsed.get_key_element().lstrip("+~")
    if value is NOT_IN_CONFIG:
        value = None if parsed.is_delete() else parsed.value()
    if key.startswith(TRAINED_TRAINER_KEYS):
        if key == "trainer.v1.trainer_mode" and isinstance(value, str) and value in SYNC_MODES:
            return None  # the default trainer, said or not, quoted or not
    elif key.startswith(LOCATION_KEYS):
        return None
    rank, short = _short(key)
    if parsed.is_delete():
        return key, rank, f"{short}=deleted", f"{key} deleted", False
    if key == MODEL_PATH and isinstance(value, str):
        path = value.rstrip("/") or value
        return key, -2, f"model={path.rsplit('/', 1)[-1]}", f"{key}={value_text(path)}", True
    files = _data_files(value) if key == TRAIN_FILES else None
    if files is not None:
        names, paths, lossy = files
        return key, -1, f"train_files={names}", f"{key}={paths}", lossy
    text = value_text(value)
    return key, rank, f"{short}={text}", f"{key}={text}", False


def _effective(overrides: Iterable[tuple[str, Any]]) -> dict[str, _Item]:
    """key -> (rank, text, hashed, lossy), the last value of each key winning, as Hydra applies overrides."""
    items: dict[str, _Item] = {}
    for override, value in overrides:
        item = training_item(override, value)
        if item is not None:
            items[item[0]] = item[1:]
    return items


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:_HASH_LEN]


def swept_keys(arguments: Iterable[str]) -> frozenset[str]:
    """The keys a multirun's command line sweeps (``key=a,b``, ``key=range(...)``, ...); other arguments ignored."""
    keys = set()
    for argument in arguments:
        if argument.startswith("-") or "=" not in argument:
            continue
        try:
            parsed = _parse(argument)
        except Exception:  # not an override Hydra reads: Hydra itself reports it
            continue
        if parsed.is_sweep_override():
            keys.add(parsed.get_key_element().lstrip("+~"))
    return frozenset(keys)


def experiment_name(method: str, task_overrides: Sequence[str], prefix: Optional[str] = None,
                    script_overrides: int = 0, swept: Iterable[str] = (), value_of: Optional[ValueOf] = None) -> str:
    """The run's name from the method and the job's overrides (Hydra's ``overrides.task``, in command-line order).

    ``script_overrides``: how many of the first overrides are a launch script's own settings (hashed, not
    spelled out); ``prefix``: the name's first part (the scripts name their setup, e.g. ``qwen2.5-math-1.5b``);
    ``swept``: the keys a multirun sweeps (``swept_keys``), spelled out even when they do not change training;
    ``value_of``: what the job's config holds for a key, interpolations resolved (``config_values``), or
    ``NOT_IN_CONFIG``; without it each override counts by its own value.
    """
    overrides = list(task_overrides)
    if not 0 <= script_overrides <= len(overrides):
        raise RecipeConfigError(
            f"run_name.script_overrides={script_overrides}: must count overrides on the command line (0 to "
            f"{len(overrides)})"
        )
    keys = [_key(override) for override in overrides]
    last = {key: index for index, key in enumerate(keys)}
    # The config holds the last value of a key: an earlier override of it (a script's setting the user changes)
    # counts by its own value.
    values = [value_of(key) if value_of is not None and last[key] == index else NOT_IN_CONFIG
              for index, key in enumerate(keys)]
    pairs = list(zip(overrides, values))
    script = _effective(pairs[:script_overrides])
    everything = _effective(pairs)
    # The user's overrides that change the script's setting (all of them without a script), spelled out.
    spelled = {key: item for key, item in _effective(pairs[script_overrides:]).items() if script.get(key) != item}
    for override, value in pairs:
        key = _key(override)
        if key in swept and key not in everything and not key.startswith(_NAMED_KEYS):
            if value is NOT_IN_CONFIG:
                value = _parse(override).value()
            rank, short = _short(key)
            text = value_text(value)
            spelled[key] = everything[key] = (rank, f"{short}={text}", f"{key}={text}", False)
    # What the sweep varies goes first, so that a name cut at MAX_NAME_LEN still tells its jobs apart.
    spelled = {key: (rank - len(_PREFIXES) - 3 if key in swept else rank, text, hashed, lossy)
               for key, (rank, text, hashed, lossy) in spelled.items()}
    parts = [part for part in (prefix, method) if part]
    parts += [text for _, text, _, _ in sorted(spelled.values())]
    raw = "-".join(parts)
    name = re.sub(r"[^A-Za-z0-9_.=,+-]", "_", raw)
    fingerprint = "\n".join([str(prefix), method, *(item[2] for _, item in sorted(everything.items()))])
    # The hash also goes on when the readable part lost something: a model or data file shown by its name only,
    # or characters a folder name cannot hold (a/b and a_b would otherwise meet).
    lossy = name != raw or any(item[3] for item in spelled.values())
    if script_overrides or lossy or len(name) > MAX_NAME_LEN:
        name = f"{name[: MAX_NAME_LEN - _HASH_LEN - 1].rstrip('-')}-{_digest(fingerprint)}"
    return name


# ---- a Hydra job's name, and a multirun's jobs -------------------------------------------------------------------


def config_value(config: Any, key: str) -> Any:
    """What ``config`` holds at ``key``, interpolations resolved (a list or a mapping as plain Python), or
    ``NOT_IN_CONFIG`` where it holds nothing or the value does not resolve (the run's own resolve then says why)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    try:
        node = OmegaConf.select(config, key, default=NOT_IN_CONFIG)
        if isinstance(node, (DictConfig, ListConfig)):
            return OmegaConf.to_container(node, resolve=True)
    except Exception:
        return NOT_IN_CONFIG
    return node


def job_name(config: Any, choices: Mapping[str, Any], task_overrides: Sequence[str],
             swept: Iterable[str] = ()) -> str:
    """The name of a Hydra job: its config (before ``OmegaConf.resolve``: values are resolved key by key), its
    config group choices (``hydra.runtime.choices``) and its overrides (``hydra.overrides.task``)."""
    method = choices.get("method") or str(config.algorithm.adv_estimator)
    run_name = config.get("run_name") or {}
    script_overrides = run_name.get("script_overrides", 0)
    if not isinstance(script_overrides, int) or isinstance(script_overrides, bool):
        raise RecipeConfigError(f"run_name.script_overrides={script_overrides!r}: must be a whole number")
    groups = set(choices)

    def value_of(key: str) -> Any:
        return NOT_IN_CONFIG if key in groups else config_value(config, key)

    return experiment_name(method, list(task_overrides), prefix=run_name.get("prefix"),
                           script_overrides=script_overrides, swept=swept, value_of=value_of)


def sweep_arguments(hydra_config: Any, argv: Sequence[str]) -> list[str]:
    """What a multirun sweeps over: the sweeper's ``params`` from the config, then the overrides of its command
    line (``sys.argv[1:]``, as Hydra's own argument parser reads them), as ``BasicSweeper.sweep`` takes them."""
    from hydra._internal.utils import get_args_parser

    try:
        overrides = list(get_args_parser().parse_known_args(list(argv))[0].overrides or [])
    except (SystemExit, Exception):  # not Hydra's command line: its plain key=value arguments
        overrides = [argument for argument in argv if not argument.startswith("-") and "=" in argument]
    params = hydra_config.sweeper.get("params") or {}
    return [f"{key}={value}" for key, value in params.items()] + overrides


def sweep_jobs(arguments: Sequence[str]) -> list[list[str]]:
    """The jobs of a basic-sweeper multirun over ``arguments``, each as its overrides (Hydra's own expansion:
    ``BasicSweeper.split_arguments``, in launch order)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(list(arguments))  # glob() needs the loader
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


# Sweeps this process has checked (the basic launcher runs every job of a sweep in one process).
_CHECKED_SWEEPS: set[tuple] = set()


def _folder(path: Any) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(str(path))))


def check_the_sweep(config: Any, hydra_config: Any, arguments: Sequence[str]) -> None:
    """Refuse a basic-sweeper multirun (``arguments``: ``sweep_arguments``) two of whose jobs would write one
    checkpoint folder (the second would resume the first), before any job trains: every job's name and
    ``trainer.default_local_dir``, from this job's config with each job's swept values in place. Run by each
    job (``hydra_config``: its ``HydraConfig``); checked once per sweep and process."""
    from omegaconf import OmegaConf, open_dict

    if not str(hydra_config.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return  # another sweeper picks its jobs as it goes
    checked = (tuple(arguments), str(hydra_config.sweep.dir))
    if checked in _CHECKED_SWEEPS:
        return
    try:
        jobs = sweep_jobs(arguments)
    except Exception:  # a sweep Hydra cannot expand: Hydra refuses it itself
        return
    swept = swept_keys(arguments)
    choices = dict(hydra_config.runtime.choices)
    scratch = copy.deepcopy(config)
    seen: dict[str, tuple[int, list[str], str]] = {}
    for number, job in enumerate(jobs):
        task = [override for override in job if not _parse(override).is_hydra_override()]  # as Hydra splits
        job_choices = dict(choices)
        with open_dict(scratch):
            for override in task:
                key = _key(override)
                if key in choices:
                    job_choices[key] = _parse(override).value()
                elif key in swept:  # the rest is the same in every job, so already in this job's config
                    try:
                        OmegaConf.update(scratch, key, _parse(override).value(), merge=True, force_add=True)
                    except Exception:  # the job's own composition refuses it
                        pass
            if "data.seed" in swept:  # a seed torch cannot take would stop its job after the ones before it ran
                from recipe_apo.integration.validation import check_data_seed

                try:
                    check_data_seed(scratch)
                except RecipeConfigError as exc:
                    raise RecipeConfigError(f"job #{number} of this multirun: {exc}") from None
            explicit = scratch.trainer.get("experiment_name")
            name = explicit or job_name(scratch, job_choices, task, swept)
            scratch.trainer.experiment_name = name
            folder = config_value(scratch, "trainer.default_local_dir")
            scratch.trainer.experiment_name = explicit
        if folder is NOT_IN_CONFIG or folder is None:
            continue
        where = _folder(folder)
        shown = [override for override in task if _key(override) in swept] or task
        if where in seen:
            first, first_shown, first_name = seen[where]
            names = f"run name {name}" if name == first_name else f"run names {first_name} and {name}"
            raise RecipeConfigError(
                f"jobs #{first} ({' '.join(first_shown)}) and #{number} ({' '.join(shown)}) of this multirun would "
                f"share the checkpoint folder {folder} ({names}): the second would resume the first's checkpoints; "
                f"sweep values that differ, or give each job its own trainer.experiment_name"
            )
        seen[where] = (number, shown, name)
    _CHECKED_SWEEPS.add(checked)
