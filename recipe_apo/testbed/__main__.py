"""``python -m recipe_apo.testbed [overrides]``: GRPO, Dr. GRPO, APO and CoDaPO trained side by side on CPU.

``mode=signal`` measures Proposition 1 instead; ``mode=league`` ranks every method of ``league`` against every
other on each of its scenarios (recipe_apo/testbed/league.py). ``-m`` sweeps (e.g.
``-m algorithm.apo.lambda_scale=1.1,1.5,2.0``) write one folder per job; ``python -m recipe_apo.testbed.collect
<multirun dir>`` gathers them in one table.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

# Imported here, not only in the __main__ block: a spawned worker process imports this module and, with
# RECIPE_APO_QUIET=1 from its parent, is as quiet (recipe_apo/integration/quiet.py).
from recipe_apo.integration import quiet
from recipe_apo.testbed.configs import method_configs, task_overrides


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
    from recipe_apo.testbed.kernels import describe

    summary["kernels"] = {**describe(), "threads": first.threads_per_worker, "workers": first.workers}
    write_outputs(summary, runs, out_dir)
    summary["wall_s"] = time.perf_counter() - started
    return summary


@hydra.main(config_path="pkg://recipe_apo.conf", config_name="testbed", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    overrides = task_overrides() or []
    if cfg.mode == "signal":
        from recipe_apo.testbed.signal import run_signal

        run_signal(cfg, out_dir)
        print(f"Proposition 1, measured: {out_dir / 'signal.png'} and {out_dir / 'signal.md'}")
        return
    if cfg.mode == "league":
        from recipe_apo.testbed.league import run_league

        print(f"Output folder: {out_dir}", flush=True)
        league = run_league(overrides, out_dir)
        print((out_dir / "league.md").read_text())
        print(f"Wrote {out_dir}/league.md, league.json, league.png and one testbed report per scenario "
              f"in {league['wall_s']:.0f} s.")
        print(f"Output folder: {out_dir}")
        return
    if cfg.mode != "train":
        raise ValueError(f"mode must be train, signal or league, got {cfg.mode!r}")
    print(f"Output folder: {out_dir}", flush=True)
    summary = run_testbed(overrides, out_dir)
    print((out_dir / "report.md").read_text())
    print(f"Wrote {out_dir}/summary.json, report.md, success.png, length.png, anchor.png, grad_norm.png "
          f"in {summary['wall_s']:.0f} s.")
    print(f"Output folder: {out_dir}")


if __name__ == "__main__":
    from recipe_apo.testbed import kernels

    kernels.reexec_pinned()  # the same CPU kernels on any x86 machine (recipe_apo/testbed/kernels.py)
    quiet.install()  # verl's warnings about the accelerators and engines a CPU has not (integration/quiet.py)
    main()
