"""Benchmark: the registered ``apo`` and ``codapo`` estimators against verl's ``grpo`` and ``grpo_vectorized``.

What is measured: wall time of one estimator call on the driver (CPU), on the same batch for every method.
The batch is shaped like verl's: groups of ``--group`` responses sharing a uid (uuid4 strings, each repeated
``--group`` times in a row, as ``DataProto.repeat(interleave=True)`` lays them out), random response lengths
and a binary 0/1 reward on the last valid token of each response. Two inputs (``--inputs``), each measured on
its own batch: ``int64-mask``, an int64 ``response_mask`` (what verl's agent loop produces) of ``--length``
tokens; ``float-mask-256``, a float32 mask of 256 tokens (verl's trainer casts the mask to float in places).

Every method is called the way verl calls it:

- ``apo``: ``get_adv_estimator_fn("apo")(token_level_rewards=, response_mask=, config=, index=)`` with
  ``config`` an OmegaConf ``algorithm`` node ``{"apo": {}}``; the driver anchor is reset before each call, so
  every call does the same work (a warm start).
- ``grpo``: ``core_algos.compute_grpo_outcome_advantage(..., norm_adv_by_std_in_grpo=True)``, verl's
  per-response Python loop.
- ``grpo_vectorized``: ``get_adv_estimator_fn("grpo_vectorized")`` with the same config.
- ``codapo``: ``get_adv_estimator_fn("codapo")`` with the same config, inside ``driver_state.handed`` with random
  float32 old log-probs (what the recipe's trainer hands it). CoDaPO's own code loops over responses in Python
  as verl's ``grpo`` does, so ``codapo/grpo`` is the gain of the vectorized version.
- ``rarity``: R2PO's head-phase estimator, ``get_adv_estimator_fn("rarity")`` with the same config (one sort of
  the batch by group and reward).
- ``floor``: the least any outcome estimator does: group the uids (``pandas.factorize``), sum each response's
  rewards, and write a float32 (batch, length) output, the mask times one value per row. ``apo/floor`` is what
  APO costs beyond that.

Repeats are interleaved (one call of each method per round, method order rotated every round), so load from
other processes on the machine falls on all methods in the same time window. It does not slow them alike: a
method made of many small multi-threaded torch ops stalls far more than one made of a few large ones when
another process holds a core, so the table header gives the 1-min load average; trust ratios from a quiet
machine (or compare with ``--threads 1``). The table gives the median per method and the ratios of medians,
with the targets apo <= 0.05x grpo, apo <= 2x floor, apo <= 0.5x grpo_vectorized, codapo <= 0.1x grpo and
rarity <= 2x floor at 65,536 responses, on both inputs.

Run from the repository root::

    .venv/bin/python scripts/bench_estimator.py
    .venv/bin/python scripts/bench_estimator.py --quick     # the targets only: 65,536 responses, 5 repeats
    .venv/bin/python scripts/bench_estimator.py --sizes 65536 --repeats 15 --out /tmp/bench_estimator.json
    .venv/bin/python scripts/bench_estimator.py --no-skip-slow      # full repeats of grpo at every size

By default (``--skip-slow``) verl's Python-loop ``grpo`` is called only ``--slow-repeats`` times (default 1)
at sizes above 65,536, where one call takes several seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from typing import Callable

import numpy as np
import torch

METHODS = ("apo", "grpo", "grpo_vectorized", "codapo", "rarity", "floor")
# Targets are stated for this size only.
TARGET_SIZE = 65_536
TARGETS = {"apo/grpo": 0.05, "apo/floor": 2.0, "apo/grpo_vectorized": 0.5, "codapo/grpo": 0.1, "rarity/floor": 2.0}
# Input name -> (mask dtype, response length; None: --length).
INPUTS = {"int64-mask": (torch.int64, None), "float-mask-256": (torch.float32, 256)}
# Above this size verl's per-response Python loop is slow enough that --skip-slow thins its repeats.
SLOW_ABOVE = 65_536


def make_batch(n: int, group: int, length: int, seed: int, mask_dtype: torch.dtype = torch.int64) -> dict:
    if n % group:
        raise SystemExit(f"--sizes: {n} is not a multiple of the group size {group}")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (n,), generator=gen)
    response_mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(mask_dtype)
    rewards = torch.zeros(n, length, dtype=torch.float32)
    rewards[torch.arange(n), lengths - 1] = torch.randint(0, 2, (n,), generator=gen).to(torch.float32)
    # uuid4 strings from a seeded RNG: verl's uids are random, but a seed keeps runs comparable.
    rng = np.random.default_rng(seed)
    uids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(n // group)]
    index = np.repeat(np.array(uids, dtype=object), group)
    old_log_probs = -torch.rand(n, length, generator=gen)
    return {"token_level_rewards": rewards, "response_mask": response_mask, "index": index,
            "old_log_probs": old_log_probs}


def make_methods(batch: dict) -> dict[str, Callable[[], object]]:
    import pandas as pd
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos

    from recipe_apo.methods.apo.anchor import reset_driver_anchors
    from recipe_apo.methods.driver_state import handed

    config = OmegaConf.create({"apo": {}})
    apo_fn = core_algos.get_adv_estimator_fn("apo")
    grpo_vec_fn = core_algos.get_adv_estimator_fn("grpo_vectorized")
    codapo_fn = core_algos.get_adv_estimator_fn("codapo")
    rarity_fn = core_algos.get_adv_estimator_fn("rarity")
    rewards, mask, index = batch["token_level_rewards"], batch["response_mask"], batch["index"]

    def apo():
        # Without the reset, the first call warm-starts the anchor and later calls do a regular update.
        reset_driver_anchors()
        return apo_fn(token_level_rewards=rewards, response_mask=mask, config=config, index=index)

    def grpo():
        return core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=True
        )

    def grpo_vectorized():
        return grpo_vec_fn(token_level_rewards=rewards, response_mask=mask, config=config, index=index)

    def codapo():
        with handed(old_log_probs=batch["old_log_probs"]):
            return codapo_fn(token_level_rewards=rewards, response_mask=mask, config=config, index=index)

    def rarity():
        return rarity_fn(token_level_rewards=rewards, response_mask=mask, config=config, index=index)

    def floor():
        pd.factorize(index)
        sums = rewards.sum(dim=-1)
        return torch.empty_like(mask, dtype=torch.float32).copy_(mask).mul_(sums.unsqueeze(-1))

    return {"apo": apo, "grpo": grpo, "grpo_vectorized": grpo_vectorized, "codapo": codapo, "rarity": rarity,
            "floor": floor}


def time_call(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - start
    # Freed outside the timed region, so deallocating the (batch, length) result is charged to no one.
    del out
    return elapsed


def bench_size(n: int, args: argparse.Namespace, input_name: str) -> dict:
    mask_dtype, length = INPUTS[input_name]
    length = length or args.length
    log(f"[{input_name} n={n}] building batch ({n} x {length}, group {args.group})")
    batch = make_batch(n, args.group, length, args.seed, mask_dtype)
    methods = make_methods(batch)
    repeats = {name: args.repeats for name in METHODS}
    if args.skip_slow and n > SLOW_ABOVE:
        repeats["grpo"] = min(args.slow_repeats, args.repeats)

    # First calls pay one-off costs (lazy imports, allocator growth); the slow loop has none worth a call.
    for name, fn in methods.items():
        if repeats[name] == args.repeats:
            time_call(fn)

    samples: dict[str, list[float]] = {name: [] for name in METHODS}
    for rnd in range(args.repeats):
        # Rotating the order keeps any position effect (cache state, allocator state) off a single method.
        order = METHODS[rnd % len(METHODS):] + METHODS[: rnd % len(METHODS)]
        for name in order:
            if len(samples[name]) >= repeats[name]:
                continue
            seconds = time_call(methods[name])
            samples[name].append(seconds)
            log(f"[{input_name} n={n}] round {rnd + 1}/{args.repeats} {name:<16} {seconds * 1e3:10.1f} ms")
    del batch, methods
    medians = {name: statistics.median(s) if s else None for name, s in samples.items()}
    return {"input": input_name, "length": length, "responses": n, "samples_s": samples, "median_s": medians}


def ratio(a, b):
    return None if a is None or b is None else a / b


def fmt_ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:,.1f}"


def fmt_ratio(value, target, n) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.3f}x"
    if n == TARGET_SIZE:
        text += f" (target <= {target}x: {'met' if value <= target else 'MISSED'})"
    return text


def render(results: list[dict]) -> str:
    lines = [
        "| input | responses | apo median ms | grpo median ms (calls) | grpo_vectorized median ms "
        "| codapo median ms | rarity median ms | floor median ms | " + " | ".join(TARGETS) + " |",
        "|---|---:|---:|---:|---:|---:|---:|---:|" + "---|" * len(TARGETS),
    ]
    for row in results:
        n, med = row["responses"], row["median_s"]
        lines.append(
            f"| {row['input']} (length {row['length']}) | {n:,} | {fmt_ms(med['apo'])} "
            f"| {fmt_ms(med['grpo'])} ({len(row['samples_s']['grpo'])}) "
            f"| {fmt_ms(med['grpo_vectorized'])} | {fmt_ms(med['codapo'])} | {fmt_ms(med['rarity'])} "
            f"| {fmt_ms(med['floor'])} | "
            + " | ".join(fmt_ratio(row["ratios"][key], target, n) for key, target in TARGETS.items()) + " |"
        )
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="numbers of responses (multiples of --group); default 8192 65536 262144")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per method and size (default 11)")
    parser.add_argument("--quick", action="store_true",
                        help=f"the targets' size only ({TARGET_SIZE:,}) and 5 repeats, unless --sizes/--repeats say")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--skip-slow", action=argparse.BooleanOptionalAction, default=True,
                        help=f"call verl's Python-loop grpo only --slow-repeats times above {SLOW_ABOVE:,} responses")
    parser.add_argument("--slow-repeats", type=int, default=1,
                        help="grpo calls at the slow sizes with --skip-slow (0 leaves grpo out there)")
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (rollout.n)")
    parser.add_argument("--length", type=int, default=512, help="response length (padded width)")
    parser.add_argument("--inputs", nargs="+", choices=tuple(INPUTS), default=list(INPUTS),
                        help="the batches to measure on (default: both)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the results as JSON to this path")
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = [TARGET_SIZE] if args.quick else [8_192, 65_536, 262_144]
    if args.repeats is None:
        args.repeats = 5 if args.quick else 11
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators and losses)

    load_before = os.getloadavg()[0]
    results = []
    for input_name in args.inputs:
        for n in args.sizes:
            row = bench_size(n, args, input_name)
            med = row["median_s"]
            row["ratios"] = {key: ratio(med[key.split("/")[0]], med[key.split("/")[1]]) for key in TARGETS}
            results.append(row)

    print(
        f"\nAdvantage estimators, median wall time per call ({args.repeats} interleaved repeats; grpo count in "
        f"brackets), group {args.group}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; 1-min load average {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after (the benchmark itself adds up to {args.threads})\n"
    )
    print(render(results), flush=True)
    target_rows = [r for r in results if r["responses"] == TARGET_SIZE]
    for row in target_rows:
        verdicts = []
        for key, target in TARGETS.items():
            value = row["ratios"][key]
            verdicts.append(f"{key} = {'n/a' if value is None else f'{value:.3f}'} (target <= {target})"
                            f" {'met' if value is not None and value <= target else 'MISSED'}")
        print(f"\nTargets at {TARGET_SIZE:,}, {row['input']}: " + "; ".join(verdicts))

    if args.out:
        payload = {
            "benchmark": "advantage_estimator",
            "args": vars(args),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "targets_at": TARGET_SIZE,
            "targets": TARGETS,
            "loadavg_1min": {"before": load_before, "after": os.getloadavg()[0]},
            "results": results,
        }
        with open(args.out, "w") as fh:
            json.dump(payload, fh, indent=2)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
