"""Everything ``python -m recipe_apo.testbed`` refuses, refused before any work starts, each as one line.

Hydra composes the command line, then calls the app's callbacks (``on_run_start``), then creates the output
folder and calls the app. ``Preflight`` (testbed.yaml's ``hydra.callbacks.preflight``) sits between the first two:
it checks the output folder (``check_output_folder``: not a file, writable, or creatable), every setting
(``settings.check_settings``) and, per mode, every method's composed config and every league scenario
(``prepare``), so a refused run leaves nothing behind, not even its output folder. The app reuses what it checked
(``planned``). A ``-m`` sweep (Hydra's basic sweeper): its folder and every job, before the first job starts.

``refusal`` says, as the line after ``recipe-apo: error:``, what reaches the entry (``__main__.cli``): the recipe's
own errors (``RecipeError``, the testbed's ``TestbedSettingError`` among them) and, raised before the app started,
Hydra's and OmegaConf's errors and an output folder Hydra could not write.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from recipe_apo.errors import RecipeError, recipe_error
from recipe_apo.testbed.configs import compose_testbed
from recipe_apo.testbed.hydra_errors import hydra_line
from recipe_apo.testbed.setting_check import check_settings
from recipe_apo.testbed.setting_rules import refuse


@dataclass
class Plan:
    """A run's mode and what was composed and checked for it: the methods' configs (train), the league's."""

    mode: str
    cfgs: Optional[dict[str, DictConfig]] = None
    league: Any = None


# Plans checked by the callback, by the command line's overrides, for the app to take.
_PLANS: dict[tuple[str, ...], Plan] = {}


def check_output_folder(key: str, folder: Any) -> None:
    """Refuse an output folder the run could not write: a file, a read-only folder, or a folder to create
    under a file or a read-only folder. Creates nothing."""
    path = Path(os.path.abspath(str(folder)))
    if path.exists():
        if not path.is_dir():
            raise refuse(key, str(folder), "a file, not a folder: name a folder for the run's outputs")
        if not os.access(path, os.W_OK | os.X_OK):
            raise refuse(key, str(folder), "a read-only folder: name one this user can write")
        return
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise refuse(key, str(folder), f"cannot be created: {above} is a file")
    if not os.access(above, os.W_OK | os.X_OK):
        raise refuse(key, str(folder), f"cannot be created: {above} is read-only")


def prepare(cfg: DictConfig, overrides: list[str]) -> Plan:
    """Check a job's composed config and compose and check what its mode runs, before any work."""
    check_settings(cfg)
    mode = str(cfg.mode)
    if mode == "train":
        from recipe_apo.testbed.runner import checked_configs

        return Plan(mode, cfgs=checked_configs(overrides))
    if mode == "league":
        from recipe_apo.testbed.league import plan_league

        return Plan(mode, league=plan_league(overrides))
    return Plan(mode)  # signal: its settings, and algorithm.apo's, are checked above


def planned(cfg: DictConfig, overrides: list[str]) -> Plan:
    """The plan ``Preflight`` checked for these overrides, or one checked now (a sweep's job, a direct call)."""
    plan = _PLANS.pop(tuple(overrides), None)
    return plan if plan is not None else prepare(cfg, overrides)


def _job_config(config: DictConfig) -> DictConfig:
    """The app's config (without ``hydra``), as Hydra hands it to the app."""
    cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with read_write(cfg), open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def say_and_exit(exc: RecipeError, status: int = 2) -> None:
    """``recipe-apo: error: <the error's one line>`` on stderr, then exit ``status`` (2: a refusal).

    A ``SystemExit``: Hydra catches an ``Exception`` a callback raises (it warns and goes on) and logs one the app
    raises ("Error executing job ...") before raising it again; neither touches a ``SystemExit``."""
    print(f"recipe-apo: error: {one_line(exc)}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).removeprefix("recipe-apo: ").split())


class Preflight(Callback):
    """Before Hydra creates the output folder: the folder, every setting and what the mode runs, checked (a run;
    a ``-m`` sweep: its folder and each of its jobs). A refusal ends the process here (``say_and_exit``)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _PLANS.clear()
        try:
            check_output_folder("hydra.run.dir", config.hydra.run.dir)
            overrides = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]
            _PLANS[tuple(overrides)] = prepare(_job_config(config), overrides)
        except RecipeError as exc:
            say_and_exit(exc)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _PLANS.clear()
        try:
            check_output_folder("hydra.sweep.dir", config.hydra.sweep.dir)
            for job in sweep_jobs(config):
                _PLANS[tuple(job)] = prepare(compose_testbed(job), job)
        except RecipeError as exc:
            say_and_exit(exc)


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """Each job's overrides of a ``-m`` sweep, as Hydra's basic sweeper will hand them to its jobs (its params,
    then the command line, expanded); none for another sweeper (its jobs are checked when each starts)."""
    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return []
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(config, "hydra.sweeper.params")
    params = OmegaConf.to_container(params, resolve=False) if OmegaConf.is_config(params) else params or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    try:
        batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    except Exception:  # a sweep the basic sweeper refuses: it says so itself when it starts
        return []
    return [list(job) for batch in batches for job in batch]


def refusal(exc: BaseException, from_app: bool, overrides: list[str]) -> Optional[str]:
    """What ``recipe-apo: error:`` says of ``exc``, or None for an error to show as it is (a fault of the code,
    not of a setting). ``from_app``: the app raised it (not Hydra before it); ``overrides``: the command line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    own = recipe_error(exc)
    if own is not None:
        return one_line(own)
    if from_app:
        return None
    if isinstance(exc, (HydraException, OmegaConfBaseException)):
        return hydra_line(exc, overrides)
    if isinstance(exc, OSError) and exc.filename:
        # Hydra creating or writing the output folder (.hydra/, the job's log) before the app started.
        return f"{exc.filename}: {exc.strerror or type(exc).__name__}: Hydra could not create or write the run's folder"
    return None
