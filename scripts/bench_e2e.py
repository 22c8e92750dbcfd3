"""Benchmark: GRPO, Dr. GRPO and APO through verl's whole training loop (the CPU rehearsal), side by side.

Each method trains ``--steps`` steps with ``python -m recipe_apo.main method=<m> rehearsal=cpu`` on the tiny model
and dataset (one Hydra multirun, the same command line as ``make rehearse``, no checkpoints, no validation).
Printed per method: seconds per step and per stage as verl times them (``timing_s/gen``, ``old_log_prob``,
``adv``, ``update_actor``, ``step``), tokens per second (``perf/throughput``), and the ratio of each to GRPO's.

The learning rate is 0 by default (``--lr``): every method then samples from the same, unchanging policy, so
the rollouts (and the generation time) are alike and the difference between methods is what their estimator
and loss cost. Each run's first step is left out (it also starts verl's agent-loop workers). Methods run one after
another, so ``--rounds`` repeats the multirun with the order rotated, and the figures are medians over all
rounds' steps (tokens per second: all tokens over all seconds). Target: APO's throughput at least 0.98x GRPO's.

Run from the repository root::

    .venv/bin/python scripts/bench_e2e.py --steps 30 --rounds 2   # about 9 minutes on 2 cores
    .venv/bin/python scripts/bench_e2e.py --workers 2 --dynamic-bsz 80   # data parallel, micro-batches by tokens
    .venv/bin/python scripts/bench_e2e.py --mode colocate_async           # verl's asynchronous colocated trainer
    .venv-vllm/bin/python scripts/bench_e2e.py --engine vllm              # verl's vLLM rollout (make test-vllm's env)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from recipe_apo.cpu import rehearse
from recipe_apo.cpu.make_tiny import OutDirError, make_tiny

STAGES = ("gen", "old_log_prob", "adv", "update_actor", "step")
TARGET = 0.98  # APO throughput / GRPO throughput


def throughput(rows: list[dict]) -> float:
    """Tokens per second over all ``rows``: total tokens over total step seconds."""
    return sum(r["perf/total_num_tokens"] for r in rows) / sum(r["timing_s/step"] for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps per method and round (default 30)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="multiruns of all methods, each in a rotated order, so drift falls on all (default 2)")
    parser.add_argument("--lr", type=float, default=0.0, help="actor learning rate (default 0: a fixed policy)")
    parser.add_argument("--methods", default="grpo,drgrpo,apo", help="presets, the first is the baseline")
    parser.add_argument("--workers", type=int, default=1,
                        help="data-parallel FSDP workers (trainer.n_gpus_per_node; default 1)")
    parser.add_argument("--dynamic-bsz", type=int, default=None, metavar="TOKENS",
                        help="use_dynamic_bsz with this ppo_max_token_len_per_gpu (default: fixed micro-batches)")
    parser.add_argument("--mode", default="sync", choices=["sync", "colocate_async"],
                        help="verl's trainer mode (trainer.v1.trainer_mode; default sync)")
    parser.add_argument("--engine", default="hf", choices=rehearse.ENGINES,
                        help="rollout engine: the rehearsal's hf backend (default) or verl's vLLM rollout on vLLM's "
                             "CPU build (run with .venv-vllm/bin/python)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one)")
    args = parser.parse_args()
    if args.steps < 2 or args.rounds < 1 or args.workers < 1:
        parser.error("--steps must be >= 2 (the first step of each run is left out), --rounds and --workers >= 1")
    shape = [f"trainer.n_gpus_per_node={args.workers}", f"trainer.v1.trainer_mode={args.mode}"]
    if args.dynamic_bsz is not None:
        shape += ["actor_rollout_ref.actor.use_dynamic_bsz=true",
                  f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.dynamic_bsz}"]
    methods = [m for m in args.methods.split(",") if m]
    out = (args.out or Path(tempfile.mkdtemp(prefix="bench_e2e_"))).resolve()
    try:
        paths = make_tiny(out / "tiny", progress=None)
    except OutDirError as exc:  # a tiny/ the recipe did not make: kept, and said in one line
        parser.error(str(exc))
    steps: dict[str, list[dict]] = {m: [] for m in methods}
    per_round: list[dict[str, float]] = []
    for round_ in range(args.rounds):
        order = methods[round_ % len(methods):] + methods[: round_ % len(methods)]
        command = rehearse.recipe_command(
            order, paths, f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1",
            "trainer.val_before_train=false", f"actor_rollout_ref.actor.optim.lr={args.lr}",
            # Each round a fresh start: another experiment name, hence no resume of the previous round.
            f"+bench_round={round_}", *shape, engine=args.engine,
        )
        if len(order) == 1:
            command.insert(3, "-m")
        root = out / "metrics" / f"round{round_}"
        result = rehearse.run_logged(command, out / f"round{round_}.log", cwd=out, env=rehearse.rehearsal_env(root),
                                     label=f"round {round_ + 1}/{args.rounds}")
        if result.returncode != 0:
            print("\n".join(result.log.read_text().splitlines()[-30:]))
            return 1
        this_round = {}
        for method, name in zip(order, rehearse.experiment_names(result.log)):
            kept = rehearse.read_metrics(rehearse.metrics_file(root, name))[1:]
            steps[method] += kept
            this_round[method] = throughput(kept)
        per_round.append(this_round)
    rows = {}
    for method, pooled in steps.items():
        rows[method] = {stage: statistics.median(r[f"timing_s/{stage}"] for r in pooled) for stage in STAGES}
        rows[method]["throughput"] = throughput(pooled)
        rows[method]["compute"] = sum(rows[method][s] for s in ("old_log_prob", "adv", "update_actor"))
    base = methods[0]
    print(f"\n{len(steps[base])} steps per method ({args.rounds} rounds x {args.steps - 1} after each run's first), "
          f"lr {args.lr}, {args.engine} rollout, trainer mode {args.mode}, {args.workers} FSDP worker(s), "
          f"{'dynamic micro-batches of <= %d tokens' % args.dynamic_bsz if args.dynamic_bsz else 'fixed micro-batches'}"
          f"; medians of verl's timing_s/*; ratios are to {base}\n")
    head = ["method", *(f"s/{s}" for s in STAGES), "tokens/s", f"throughput / {base}",
            f"old_log_prob+adv+update / {base}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for method, row in rows.items():
        cells = [method, *(f"{row[s]:.3f}" for s in STAGES), f"{row['throughput']:.1f}",
                 f"{row['throughput'] / rows[base]['throughput']:.3f}x",
                 f"{row['compute'] / rows[base]['compute']:.3f}x"]
        print("| " + " | ".join(cells) + " |")
    print("\nthroughput / " + base + " per round (the spread is this machine's noise): " + "; ".join(
        ", ".join(f"{m} {r[m] / r[base]:.3f}x" for m in methods if m != base) for r in per_round))
    if "apo" in rows and base != "apo":
        ratio = rows["apo"]["throughput"] / rows[base]["throughput"]
        verdict = "meets" if ratio >= TARGET else "misses"
        print(f"APO throughput / {base}: {ratio:.3f}x ({verdict} the target >= {TARGET}x)")
    print(f"\nlogs and metrics: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
