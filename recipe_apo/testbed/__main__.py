"""``python -m recipe_apo.testbed [overrides]``: GRPO, Dr. GRPO, APO and CoDaPO trained side by side on CPU
(recipe_apo/testbed/runner.py).

``mode=signal`` measures Proposition 1 instead (recipe_apo/testbed/signal.py); ``mode=league`` ranks every
method of ``league`` against every other on each of its scenarios (recipe_apo/testbed/league.py). ``-m`` sweeps
(e.g. ``-m algorithm.apo.lambda_scale=1.1,1.5,2.0``) write one folder per job; ``python -m
recipe_apo.testbed.collect <multirun dir>`` gathers them in one table.

This module only parses the command line (Hydra) and dispatches by ``mode``; each mode imports its module when
it runs.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

# Imported here, not only in the __main__ block: a spawned worker process imports this module and, with
# RECIPE_APO_QUIET=1 from its parent, is as quiet (recipe_apo/integration/quiet.py).
from recipe_apo.integration import quiet
from recipe_apo.testbed.configs import task_overrides

MODES = ("train", "signal", "league")


def _run_and_report(run, overrides: list[str], out_dir: Path, report: str, written: str) -> None:
    """``run(overrides, out_dir)``, then its markdown ``report`` and the files it ``written``, with the time."""
    print(f"Output folder: {out_dir}", flush=True)
    result = run(overrides, out_dir)
    print((out_dir / report).read_text())
    print(f"Wrote {out_dir}/{written} in {result['wall_s']:.0f} s.")
    print(f"Output folder: {out_dir}")


def train(overrides: list[str], out_dir: Path) -> None:
    from recipe_apo.testbed.runner import run_testbed

    _run_and_report(run_testbed, overrides, out_dir, "report.md",
                    "summary.json, report.md, success.png, length.png, anchor.png, grad_norm.png")


def signal(cfg: DictConfig, out_dir: Path) -> None:
    from recipe_apo.testbed.signal import run_signal

    run_signal(cfg, out_dir)
    print(f"Proposition 1, measured: {out_dir / 'signal.png'} and {out_dir / 'signal.md'}")


def league(overrides: list[str], out_dir: Path) -> None:
    from recipe_apo.testbed.league import run_league

    _run_and_report(run_league, overrides, out_dir, "league.md",
                    "league.md, league.json, league.png and one testbed report per scenario")


@hydra.main(config_path="pkg://recipe_apo.conf", config_name="testbed", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.mode not in MODES:
        raise ValueError(f"mode must be train, signal or league, got {cfg.mode!r}")
    if cfg.mode == "signal":
        signal(cfg, out_dir)
    elif cfg.mode == "league":
        league(task_overrides() or [], out_dir)
    else:
        train(task_overrides() or [], out_dir)


if __name__ == "__main__":
    from recipe_apo.testbed import kernels

    kernels.reexec_pinned()  # the same CPU kernels on any x86 machine (recipe_apo/testbed/kernels.py)
    quiet.install()  # verl's warnings about the accelerators and engines a CPU has not (integration/quiet.py)
    main()
