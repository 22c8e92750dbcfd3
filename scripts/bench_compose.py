"""Benchmark: planning the testbed's default league with Hydra's ``compose`` against the two-stage compose the testbed
uses (``recipe_apo.integration.hydra_stages``: the defaults tree once per set of group choices, the key overrides on
a copy).

``plan_league(["mode=league"])`` composes and checks every method of the default league on each of its seven
scenarios (~90 configs of a few dozen group choices); the rounds alternate the two ways, side by side in one
process, and the figure is the ratio of their medians. The configs are the same either way
(tests/testbed/test_configs.py). Target: the two-stage plan at most 0.6 of Hydra's.

Run from the repository root::

    .venv/bin/python scripts/bench_compose.py            # under a minute on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="plans per way (default 2)")
    args = parser.parse_args()

    from hydra import compose, initialize_config_module

    from recipe_apo.integration import hydra_stages
    from recipe_apo.testbed import configs
    from recipe_apo.testbed.league import plan_league

    ways = {
        "hydra compose": lambda name, overrides: compose(config_name=name, overrides=list(overrides)),
        "two stages": hydra_stages.compose_in_two_stages,
    }
    times: dict[str, list[float]] = {way: [] for way in ways}
    counts = {}
    with initialize_config_module("recipe_apo.conf", version_base=None), contextlib.redirect_stderr(io.StringIO()):
        plan_league(["mode=league"])  # imports and verl's registries, outside the timing
        for _ in range(args.rounds):
            for way, fn in ways.items():
                configs.compose_in_two_stages = fn  # what configs.compose_testbed calls
                configs.store_settings()  # every round starts with no first stage held
                started = time.perf_counter()
                plan = plan_league(["mode=league"])
                times[way].append(time.perf_counter() - started)
                counts[way] = sum(len(c) for c in plan.cfgs.values())
    configs.compose_in_two_stages = hydra_stages.compose_in_two_stages
    for way, values in times.items():
        print(f"{way:14s} plan_league: median {statistics.median(values):5.1f} s over {len(values)} rounds "
              f"({', '.join(f'{v:.1f}' for v in values)}), {counts[way]} configs")
    ratio = statistics.median(times["two stages"]) / statistics.median(times["hydra compose"])
    print(f"two stages / hydra compose: {ratio:.2f} (target <= 0.6)")
    return 0 if ratio <= 0.6 else 1


if __name__ == "__main__":
    raise SystemExit(main())
