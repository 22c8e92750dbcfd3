"""Gather the jobs of a testbed sweep into one table: ``python -m recipe_apo.testbed.collect <multirun dir>``.

A Hydra callback (``CollectSweep``, declared in conf/testbed.yaml) runs the same at the end of every
``-m`` sweep, so ``collected.md`` lands in the sweep folder without a second command. The table itself is the
report's (``recipe_apo.testbed.report.collect``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from recipe_apo.testbed.report.collect import collect


class CollectSweep(Callback):
    """At the end of a ``-m`` sweep, collect its jobs (testbed training jobs only; others are skipped)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if config.get("mode", "train") != "train" or not any(sweep_dir.rglob("summary.json")):
            return
        print(collect(sweep_dir))
        print(f"Collected into {sweep_dir / 'collected.md'}")


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m recipe_apo.testbed.collect <multirun dir>")
    print(collect(Path(argv[0])))


if __name__ == "__main__":
    main(sys.argv[1:])
