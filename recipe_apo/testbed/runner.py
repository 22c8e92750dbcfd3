"""The testbed's train mode: every method's config composed and checked before any training (``check_method``,
``checked_configs``), then every method trained on every seed and the results written (``run_testbed``).
``python -m recipe_apo.testbed`` and the league (recipe_apo/testbed/league.py) both run it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from recipe_apo.errors import RecipeError
from recipe_apo.methods import catalog
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.testbed.configs import method_configs
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.setting_check import check_settings, read_values
from recipe_apo.testbed.setting_rules import refuse


def check_method(cfg: DictConfig) -> None:
    """Fail before any training, with one line naming the key, on a setting of the wrong type or out of bounds
    or unknown (``settings.check_settings``), a name verl does not know, or a setting its actor config, the task,
    the sampling temperature or a method's runtime refuses (each active method's runtime is built once here: what
    it reads of the config it checks)."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators and losses)
    from recipe_apo.testbed.train import group_size, make_task
    from recipe_apo.testbed.update import actor_config

    check_settings(cfg)
    estimator = cfg.algorithm.adv_estimator
    if estimator not in ("gae", "grpo"):
        try:
            get_adv_estimator_fn(estimator)
        except (ValueError, KeyError) as exc:
            from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

            names = ", ".join(sorted({"gae", "grpo", *ADV_ESTIMATOR_REGISTRY}))
            raise refuse("algorithm.adv_estimator", estimator, f"an estimator registered in verl: {names}") from exc
    loss_mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    try:
        get_policy_loss_fn(loss_mode)
    except (ValueError, KeyError) as exc:
        raise refuse("actor_rollout_ref.actor.policy_loss.loss_mode", loss_mode,
                     " ".join(str(exc).split())) from exc
    try:
        actor_config(read_values(cfg)["actor_rollout_ref"]["actor"], group_size(cfg))
    except (ValueError, TypeError, AssertionError) as exc:
        if isinstance(exc, RecipeError):
            raise
        raise TestbedSettingError(f"actor_rollout_ref.actor: verl's actor config refuses it: "
                                  f"{' '.join(str(exc).split())}") from exc
    check_temperature(cfg)
    try:
        runtimes = [r for r in (m.build_runtime(cfg) for m in catalog.active(cfg)) if r is not None]
    except MethodConfigError as exc:
        raise TestbedSettingError(" ".join(str(exc).split())) from None
    for runtime in runtimes:
        if runtime.custom_answer_key is not None:
            raise TestbedSettingError(f"{runtime.custom_answer_key}: must be null in the testbed: its tasks give "
                                      "their own answer keys (task.vote_key)")
    make_task(cfg)  # the task's own checks (min_len <= max_len, room in L0)


def check_temperature(cfg: DictConfig) -> None:
    """``actor_rollout_ref.rollout.temperature``: 1.0 (the testbed's log-probs are unscaled), except in a run whose
    method sets each prompt's temperature (``Method.prompt_columns``: AGPO's, whose runtime says which it needs)."""
    temperature = cfg.actor_rollout_ref.rollout.temperature
    if any("temperature" in m.prompt_columns for m in catalog.active(cfg)):
        return
    if temperature != 1.0:
        raise refuse("actor_rollout_ref.rollout.temperature", temperature,
                     "must be 1.0: the testbed samples and takes its log-probs at temperature 1 (only a method that "
                     "sets each prompt's temperature, method=agpo_dual, samples at its own)")


def checked_configs(overrides: list[str], entries: Optional[dict[str, list[str]]] = None) -> dict[str, DictConfig]:
    """label -> composed config (``method_configs``), each checked by ``check_method``."""
    return method_configs(overrides, entries, check=check_method)


def run_testbed(
    overrides: list[str],
    out_dir: Path,
    show_progress: bool = True,
    entries: Optional[dict[str, list[str]]] = None,
    desc: str = "testbed",
    cfgs: Optional[dict[str, DictConfig]] = None,
) -> dict:
    """Compose, train every method on every seed, write summary.json / report.md / plots; return the summary.

    ``entries`` (label -> overrides) replaces the config's ``methods`` (the league passes its own); ``cfgs``,
    configs composed and checked already (``checked_configs``), replaces composing."""
    from recipe_apo.testbed.kernels import describe
    from recipe_apo.testbed.report.summary import build_summary, write_outputs
    from recipe_apo.testbed.train import run_all

    started = time.perf_counter()
    cfgs = cfgs if cfgs is not None else checked_configs(overrides, entries)
    first = next(iter(cfgs.values()))
    seeds = [int(s) for s in first.seeds]
    setups, runs = run_all(cfgs, seeds, first.workers, first.threads_per_worker, show_progress, desc)
    base = read_values(first)
    base.pop("methods", None)
    summary = build_summary(
        {label: read_values(cfg) for label, cfg in cfgs.items()},
        setups, runs, time.perf_counter() - started, base,
    )
    summary["kernels"] = {**describe(), "threads": first.threads_per_worker, "workers": first.workers}
    write_outputs(summary, runs, out_dir)
    summary["wall_s"] = time.perf_counter() - started
    return summary
