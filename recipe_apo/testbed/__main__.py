"""``python -m recipe_apo.testbed [overrides]``: GRPO, Dr. GRPO, APO and CoDaPO trained side by side on CPU
(recipe_apo/testbed/runner.py).

``mode=signal`` measures Proposition 1 instead (recipe_apo/testbed/signal.py); ``mode=league`` ranks every
method of ``league`` against every other on each of its scenarios (recipe_apo/testbed/league.py). ``-m`` sweeps
(e.g. ``-m algorithm.apo.lambda_scale=1.1,1.5,2.0``) write one folder per job; ``python -m
recipe_apo.testbed.collect <multirun dir>`` gathers them in one table.

This module only parses the command line (Hydra) and dispatches by ``mode``; each mode imports its module when
it runs. Every setting, the output folder and what each mode runs are checked before any work starts
(recipe_apo/testbed/preflight.py); ``cli`` says a refusal as the recipe's one line, ``recipe-apo: error: ...``
on stderr, exit status 2, no traceback: a refused setting, and an error Hydra raises reading the command line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig

# Imported here, not only in the __main__ block: a spawned worker process imports this module and, with
# RECIPE_APO_QUIET=1 from its parent, is as quiet (recipe_apo/integration/quiet.py).
from recipe_apo.integration import quiet
from recipe_apo.testbed import preflight
from recipe_apo.testbed.configs import task_overrides


def _run_and_report(run, overrides: list[str], out_dir: Path, report: str, written: str, **kwargs) -> None:
    """``run(overrides, out_dir)``, then its markdown ``report`` and the files it ``written``, with the time."""
    print(f"Output folder: {out_dir}", flush=True)
    result = run(overrides, out_dir, **kwargs)
    print((out_dir / report).read_text())
    print(f"Wrote {out_dir}/{written} in {result['wall_s']:.0f} s.")
    print(f"Output folder: {out_dir}")


def train(overrides: list[str], out_dir: Path, cfgs: Optional[dict] = None) -> None:
    from recipe_apo.testbed.runner import run_testbed

    _run_and_report(run_testbed, overrides, out_dir, "report.md",
                    "summary.json, report.md, success.png, length.png, metrics.png, grad_norm.png", cfgs=cfgs)


def signal(cfg: DictConfig, out_dir: Path) -> None:
    from recipe_apo.testbed.signal import run_signal

    run_signal(cfg, out_dir)
    print(f"Proposition 1, measured: {out_dir / 'signal.png'} and {out_dir / 'signal.md'}")


def league(overrides: list[str], out_dir: Path, plan=None) -> None:
    from recipe_apo.testbed.league import run_league

    _run_and_report(run_league, overrides, out_dir, "league.md",
                    "league.md, league.json, league.png and one testbed report per scenario", plan=plan)


# The exception the app itself raised, if any: what reaches ``cli`` from elsewhere came from Hydra, before the app.
_app_failure: list[BaseException] = []


@hydra.main(config_path="pkg://recipe_apo.conf", config_name="testbed", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from recipe_apo.errors import RecipeError

    try:
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        overrides = task_overrides() or []
        try:
            plan = preflight.planned(cfg, overrides)  # checked by the Preflight callback, or here (a sweep's job)
        except RecipeError as exc:  # a refused setting: its one line, exit status 2
            preflight.say_and_exit(exc)
        if plan.mode == "signal":
            signal(cfg, out_dir)
        elif plan.mode == "league":
            league(overrides, out_dir, plan.league)
        else:
            train(overrides, out_dir, plan.cfgs)
    except RecipeError as exc:  # the recipe's own error while running (bad data, state): its one line, status 1
        preflight.say_and_exit(exc, status=1)
    except BaseException as exc:
        _app_failure.append(exc)
        raise


def cli(argv: Optional[list[str]] = None) -> None:
    """``main`` on ``argv`` (default: the command line); a refusal is one line on stderr and exit status 2.

    Hydra prints what it raises itself (a misspelt override, a key it cannot set, a missing config) with its
    own frames and exits 1; with ``HYDRA_FULL_ERROR`` set it raises it instead, which is what is said here as
    one line. An error of the code (not of a setting) still shows in full."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    overrides = [a for a in sys.argv[1:] if not a.startswith("-")]
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _app_failure.clear()
    try:
        main()
    except Exception as exc:
        line = preflight.refusal(exc, any(exc is f for f in _app_failure), overrides)
        if line is None:
            raise
        print(f"recipe-apo: error: {line}", file=sys.stderr, flush=True)
        sys.exit(2)
    finally:
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


if __name__ == "__main__":
    from recipe_apo.testbed import kernels

    kernels.reexec_pinned()  # the same CPU kernels on any x86 machine (recipe_apo/testbed/kernels.py)
    quiet.install()  # verl's warnings about the accelerators and engines a CPU has not (integration/quiet.py)
    cli()
