"""The testbed's train mode: every method's config composed and checked before any training (``check_method``,
``checked_configs``), then every method trained on every seed and the results written (``run_testbed``).
``python -m recipe_apo.testbed`` and the league (recipe_apo/testbed/league.py) both run it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from recipe_apo.testbed.configs import method_configs


def check_method(cfg: DictConfig) -> None:
    """Fail before any training on a name verl does not know or a setting its actor config (or the testbed's
    algorithm.codapo / algorithm.zero_variance / staleness, the task) refuses."""
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

    from recipe_apo.methods.codapo import CodapoSettings
    from recipe_apo.methods.zero_variance import check_mode
    from recipe_apo.testbed.train import make_task
    from recipe_apo.testbed.update import ZERO_VARIANCE_MODES, actor_config, effective_agg_mode

    if cfg.algorithm.adv_estimator not in ("gae", "grpo"):
        get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    actor = actor_config(cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n)
    if cfg.algorithm.adv_estimator == "codapo":
        CodapoSettings.from_algorithm_config(cfg.algorithm)
    mode = cfg.algorithm.get("zero_variance", "keep")
    if mode not in ZERO_VARIANCE_MODES:
        raise ValueError(f"algorithm.zero_variance must be one of {', '.join(ZERO_VARIANCE_MODES)} in the testbed "
                         f"(exact: the testbed's reference only), got {mode!r}")
    if mode != "keep":
        check_mode("exclude", effective_agg_mode(actor))  # a mode without a denominator has nothing to exclude
    make_task(cfg)  # the task's own checks
    staleness = cfg.get("staleness", 0)
    if isinstance(staleness, bool) or not isinstance(staleness, int) or not 0 <= staleness <= 1000:
        raise ValueError(f"staleness must be a whole number of rounds in [0, 1000], got {staleness!r}")


def checked_configs(overrides: list[str], entries: Optional[dict[str, list[str]]] = None) -> dict[str, DictConfig]:
    """label -> composed config (``method_configs``), each checked by ``check_method``."""
    cfgs = method_configs(overrides, entries)
    for cfg in cfgs.values():
        check_method(cfg)
    return cfgs


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
    from recipe_apo.testbed.report import build_summary, write_outputs
    from recipe_apo.testbed.train import run_all

    started = time.perf_counter()
    cfgs = cfgs if cfgs is not None else checked_configs(overrides, entries)
    first = next(iter(cfgs.values()))
    seeds = [int(s) for s in first.seeds]
    setups, runs = run_all(cfgs, seeds, first.workers, first.threads_per_worker, show_progress, desc)
    base = OmegaConf.to_container(first, resolve=True)
    base.pop("methods", None)
    summary = build_summary(
        {label: OmegaConf.to_container(cfg, resolve=True) for label, cfg in cfgs.items()},
        setups, runs, time.perf_counter() - started, base,
    )
    summary["kernels"] = {**describe(), "threads": first.threads_per_worker, "workers": first.workers}
    write_outputs(summary, runs, out_dir)
    summary["wall_s"] = time.perf_counter() - started
    return summary
