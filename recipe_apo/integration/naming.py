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
- the training data by its file names (``data.train_files``), not its folder, so moving the data keeps the name;
- the model by its last path component (``model=Qwen2.5-Math-1.5B``) in the readable part, and in full in
  the hash the name then ends in.

In a Hydra multirun, a swept key comes first, and is spelled out even where it does not change what is trained
(``trainer.n_gpus_per_node=4,8``, ``trainer.total_training_steps=100,200``): jobs of one sweep that shared a name
would share a checkpoint folder, and the second would resume the first.

A script's own settings (the first ``run_name.script_overrides`` overrides) would spell out the whole script, so
they count through a hash at the end of the name; the user's overrides are spelled out after
``run_name.prefix`` and the method (``qwen2.5-math-1.5b-apo-data.max_response_length=2048-1f0c2d3e``). The hash
covers everything that counts (the script's settings, the user's, the full model path), and also ends a name
whose readable part lost something (a shortened model path, characters replaced by ``_``) or that is longer
than 96 characters (then cut).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Iterable, Optional, Sequence

from recipe_apo.integration.errors import RecipeConfigError

# Overrides that say where things are or how they are logged, not what is trained.
LOCATION_KEYS = ("method", "dry_run", "run_name.", "data.val_files", "trainer.", "ray_kwargs.", "hydra.",
                 "actor_rollout_ref.rollout.name")
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


def _short(key: str) -> tuple[int, str]:
    for rank, (prefix, short) in enumerate(_PREFIXES):
        if key.startswith(prefix):
            return rank, short + key[len(prefix):]
    return len(_PREFIXES), key


def _file_names(value: str) -> str:
    names = [part.strip().strip("'\"").rstrip("/").rsplit("/", 1)[-1] for part in value.strip("[]").split(",")]
    return ",".join(name for name in names if name)


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _key_and_value(override: str) -> tuple[str, Optional[str]]:
    """The key without Hydra's ``+``/``~`` and the value as Hydra writes it back (``1e-6`` -> ``1e-06``), None
    for a deletion (``~key``). In a multirun Hydra hands each job its overrides rewritten this way, so one
    spelling serves both routes."""
    parsed = _parser().parse_overrides([override])[0]
    value = None if parsed.is_delete() else parsed.get_value_element_as_str()
    return parsed.get_key_element().lstrip("+~"), value


def training_item(override: str) -> Optional[tuple[str, int, str, str]]:
    """``(key, rank, text in the name, what counts in the hash)`` of one override, or None when it does not
    change what is trained. The model counts in full in the hash (``.../global_step_100/actor/huggingface``
    and ``.../global_step_200/actor/huggingface`` are different models); the training data by file names."""
    key, value = _key_and_value(override)
    if key.startswith(TRAINED_TRAINER_KEYS):
        if key == "trainer.v1.trainer_mode" and value in SYNC_MODES:
            return None  # the default trainer, said or not
    elif key.startswith(LOCATION_KEYS):
        return None
    rank, short = _short(key)
    if value is None:
        return key, rank, f"{short}=deleted", f"{key} deleted"
    if key == MODEL_PATH:
        return key, -2, f"model={value.rstrip('/').rsplit('/', 1)[-1]}", f"{key}={value.rstrip('/')}"
    if key == TRAIN_FILES:
        text = f"train_files={_file_names(value)}"
        return key, -1, text, text
    return key, rank, f"{short}={value}", f"{key}={value}"


def _effective(overrides: Iterable[str]) -> dict[str, tuple[int, str, str]]:
    """key -> (rank, text, hashed), the last value of each key winning, as Hydra applies overrides."""
    items: dict[str, tuple[int, str, str]] = {}
    for override in overrides:
        item = training_item(override)
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
            parsed = _parser().parse_overrides([argument])[0]
        except Exception:  # not an override Hydra reads: Hydra itself reports it
            continue
        if parsed.is_sweep_override():
            keys.add(parsed.get_key_element().lstrip("+~"))
    return frozenset(keys)


def experiment_name(method: str, task_overrides: Sequence[str], prefix: Optional[str] = None,
                    script_overrides: int = 0, swept: Iterable[str] = ()) -> str:
    """The run's name from the method and the job's overrides (Hydra's ``overrides.task``, in command-line order).

    ``script_overrides``: how many of the first overrides are a launch script's own settings (hashed, not
    spelled out); ``prefix``: the name's first part (the scripts name their setup, e.g. ``qwen2.5-math-1.5b``);
    ``swept``: the keys a multirun sweeps (``swept_keys``), spelled out even when they do not change training.
    """
    overrides = list(task_overrides)
    if not 0 <= script_overrides <= len(overrides):
        raise RecipeConfigError(
            f"run_name.script_overrides={script_overrides}: must count overrides on the command line (0 to "
            f"{len(overrides)})"
        )
    script = _effective(overrides[:script_overrides])
    everything = _effective(overrides)
    # The user's overrides that change the script's setting (all of them without a script), spelled out.
    spelled = {key: item for key, item in _effective(overrides[script_overrides:]).items() if script.get(key) != item}
    for override in overrides:
        key, value = _key_and_value(override)
        if key in swept and key not in everything and not key.startswith(_NAMED_KEYS):
            rank, short = _short(key)
            spelled[key] = everything[key] = (rank, f"{short}={value}", f"{key}={value}")
    # What the sweep varies goes first, so that a name cut at MAX_NAME_LEN still tells its jobs apart.
    spelled = {key: (rank - len(_PREFIXES) - 3 if key in swept else rank, text, hashed)
               for key, (rank, text, hashed) in spelled.items()}
    parts = [part for part in (prefix, method) if part]
    parts += [text for _, text, _ in sorted(spelled.values())]
    raw = "-".join(parts)
    name = re.sub(r"[^A-Za-z0-9_.=,+-]", "_", raw)
    fingerprint = "\n".join([str(prefix), method, *(hashed for _, (_, _, hashed) in sorted(everything.items()))])
    # The hash also goes on when the readable part lost something: a model, shown by its folder's name only,
    # or characters a folder name cannot hold (a/b and a_b would otherwise meet).
    lossy = name != raw or MODEL_PATH in spelled
    if script_overrides or lossy or len(name) > MAX_NAME_LEN:
        name = f"{name[: MAX_NAME_LEN - _HASH_LEN - 1].rstrip('-')}-{_digest(fingerprint)}"
    return name
