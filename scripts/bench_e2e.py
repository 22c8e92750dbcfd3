"""Benchmark: GRPO, Dr. GRPO and APO through verl's whole training loop (the CPU rehearsal), side by side.

Each method trains ``--steps`` steps with ``python -m recipe_apo.main method=<m> rehearsal=cpu`` on the tiny model
and dataset (one Hydra multirun, the same command line as ``make rehearse``, no checkpoints, no validation).
Printed per method: seconds per step and per stage as verl times them (``timing_s/gen``, ``old_log_prob``,
``adv``, ``update_actor``, ``step``), tokens per second (``perf/throughput``), and the ratio of each to GRPO's.

The learning rate is 0 by default (``--lr``): every method then samples from the same, unchanging policy, so
the rollouts (and the generation time) are alike and the difference between methods is what their estimator
and loss cost. Each run's first step is left out (it also starts verl's agent-loop workers). Target: APO's
throughput at least 0.98x GRPO's.

Run from the repository root::

    .venv/bin/python scripts/bench_e2e.py --steps 12
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from recipe_apo.cpu import rehearse
from recipe_apo.cpu.make_tiny import make_tiny

STAGES = ("gen", "old_log_prob", "adv", "update_actor", "step")
TARGET = 0.98  # APO throughput / GRPO throughput


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per method (default 12)")
    parser.add_argument("--lr", type=float, default=0.0, help="actor learning rate (default 0: a fixed policy)")
    parser.add_argument("--methods", default="grpo,drgrpo,apo", help="presets, the first is the baseline")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step of each run is left out)")
    methods = [m for m in args.methods.split(",") if m]
    out = (args.out or Path(tempfile.mkdtemp(prefix="bench_e2e_"))).resolve()
    paths = make_tiny(out / "tiny", progress=None)
    command = rehearse.recipe_command(
        methods, paths, f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1",
        "trainer.val_before_train=false", f"actor_rollout_ref.actor.optim.lr={args.lr}",
    )
    if len(methods) == 1:
        command.insert(3, "-m")
    result = rehearse.run_logged(command, out / "bench.log", cwd=out, env=rehearse.rehearsal_env(out / "metrics"),
                                 label="bench")
    if result.returncode != 0:
        print("\n".join(result.log.read_text().splitlines()[-30:]))
        return 1
    rows = {}
    for method, name in zip(methods, rehearse.experiment_names(result.log)):
        steps = rehearse.read_metrics(rehearse.metrics_file(out / "metrics", name))[1:]
        rows[method] = {stage: statistics.fmean(r[f"timing_s/{stage}"] for r in steps) for stage in STAGES}
        rows[method]["throughput"] = statistics.fmean(r["perf/throughput"] for r in steps)
        rows[method]["n"] = len(steps)
    base = methods[0]
    print(f"\n{args.steps - 1} steps per method after the first, lr {args.lr}, load average {os.getloadavg()[0]:.1f}; "
          f"ratios are to {base}\n")
    head = ["method", *(f"s/{s}" for s in STAGES), "tokens/s", f"step / {base}", f"throughput / {base}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for method, row in rows.items():
        cells = [method, *(f"{row[s]:.3f}" for s in STAGES), f"{row['throughput']:.1f}",
                 f"{row['step'] / rows[base]['step']:.3f}x", f"{row['throughput'] / rows[base]['throughput']:.3f}x"]
        print("| " + " | ".join(cells) + " |")
    if "apo" in rows and base != "apo":
        ratio = rows["apo"]["throughput"] / rows[base]["throughput"]
        verdict = "meets" if ratio >= TARGET else "misses"
        print(f"\nAPO throughput / {base}: {ratio:.3f}x ({verdict} the target >= {TARGET}x)")
    print(f"\nlogs and metrics: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
