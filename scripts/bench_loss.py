"""Benchmark: forward + backward of the ``apo`` policy loss (and its one-sided form, ``apo_one_sided``) against
verl's ``vanilla`` and ``sapo``.

What is measured, per loss, on a (``--batch`` x ``--length``) micro-batch:

- time: wall time of ``loss, metrics = fn(...)`` plus ``loss.backward()`` (metrics' host transfers included,
  since verl pays them too), with a device synchronize at the end on CUDA;
- peak memory: the highest number of bytes allocated during that forward + backward, above what was allocated
  when it started (inputs excluded; the gradient of ``log_prob`` included).

Each loss is fetched with ``get_policy_loss_fn(name)`` and called as verl's ``ppo_loss`` calls it:
``fn(old_log_prob=, log_prob=<requires_grad leaf>, advantages=, response_mask=<bool>, loss_agg_mode=,
config=<actor config>, rollout_is_weights=None)``. The config is a real ``verl.workers.config.FSDPActorConfig``
(strategy fsdp2, rollout_n 8, loss_scale_factor 4096, tau_pos 1.0, tau_neg 1.05) whose ``global_batch_info``
is filled as ``ppo_loss`` fills it for one rank holding the whole batch. ``apo``, ``apo_one_sided`` and
``vanilla`` aggregate with ``seq-mean-token-sum-norm``; ``sapo`` always aggregates with ``seq-mean-token-mean``
whatever it is given, so its config says that.

How peak memory is measured:

- CUDA: ``torch.cuda.max_memory_allocated()`` after ``torch.cuda.reset_peak_memory_stats()``, minus
  ``torch.cuda.memory_allocated()`` at the start.
- CPU: torch's profiler with ``profile_memory=True``. Every allocation and free of torch's CPU allocator is
  then recorded as a ``[memory]`` event with its signed byte count and timestamp; the running sum of those
  events in time order is the bytes allocated above the start, and its maximum is the peak. This sees every
  tensor torch allocates, autograd's saved tensors and temporaries included, which ``tracemalloc`` (Python
  objects only) and ``ru_maxrss`` (process-wide high-water mark, glibc caching, import-time peaks) do not.
  The script checks the method on a known allocation before using it. Memory runs are separate from the
  timed runs, since the profiler slows every op down.

Repeats are interleaved (one call of each loss per round, order rotated every round) so load from other
processes falls on all losses in the same time window; the 1-min load average at the start is printed, since
a busy machine still slows losses with more ops more. Targets: apo time <= 1.05x sapo, apo peak memory <=
1.0x vanilla.

Run from the repository root::

    .venv/bin/python scripts/bench_loss.py
    .venv/bin/python scripts/bench_loss.py --device cuda --repeats 50 --out /tmp/bench_loss.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

# Kineto prints two log lines per profiler session; the memory runs open several. Read before torch loads it.
os.environ.setdefault("KINETO_LOG_LEVEL", "99")

import torch  # noqa: E402

METHODS = ("apo", "apo_one_sided", "vanilla", "sapo")
TIME_TARGET = 1.05  # apo / sapo
MEMORY_TARGET = 1.0  # apo / vanilla
LOSS_SCALE_FACTOR = 4096
AGG_MODES = {"apo": "seq-mean-token-sum-norm", "apo_one_sided": "seq-mean-token-sum-norm",
             "vanilla": "seq-mean-token-sum-norm", "sapo": "seq-mean-token-mean"}


def make_inputs(batch: int, length: int, device: torch.device, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, length // 8), length + 1, (batch,), generator=gen)
    # ppo_loss hands the losses a bool mask (`data["response_mask"].to(bool)`).
    response_mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    old_log_prob = -3.0 * torch.rand(batch, length, generator=gen)
    # A log-ratio spread of 0.1 puts some ratios outside the clip band, so every branch of every loss runs.
    log_prob = old_log_prob + 0.1 * torch.randn(batch, length, generator=gen)
    # Outcome advantages: one value per response (group-centered binary rewards), broadcast over its tokens.
    rewards = torch.randint(0, 2, (-(-batch // 8), 8), generator=gen).float()
    centered = (rewards - rewards.mean(dim=1, keepdim=True)).reshape(-1)[:batch]
    advantages = centered.unsqueeze(1) * response_mask
    tensors = {
        "old_log_prob": old_log_prob,
        "log_prob": log_prob,
        "advantages": advantages,
        "response_mask": response_mask,
    }
    return {k: v.to(device) for k, v in tensors.items()}


def make_config(loss_mode: str, batch: int, response_mask: torch.Tensor):
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    config = FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=8,
        ppo_mini_batch_size=batch,
        ppo_micro_batch_size_per_gpu=batch,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        loss_agg_mode=AGG_MODES[loss_mode],
        loss_scale_factor=LOSS_SCALE_FACTOR,
        tau_pos=1.0,
        tau_neg=1.05,
    )
    # As verl's ppo_loss sets it for each micro-batch (one rank, the micro-batch is the whole mini-batch).
    config.global_batch_info["dp_size"] = 1
    config.global_batch_info["batch_num_tokens"] = int(response_mask.sum())
    config.global_batch_info["global_batch_size"] = batch
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    return config


def make_methods(inputs: dict, batch: int) -> tuple[dict[str, Callable[[], None]], torch.Tensor]:
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    log_prob = inputs["log_prob"].detach().clone().requires_grad_(True)

    def build(name: str) -> Callable[[], None]:
        fn = get_policy_loss_fn(name)
        config = make_config(name, batch, inputs["response_mask"])

        def step() -> None:
            loss, _metrics = fn(
                old_log_prob=inputs["old_log_prob"],
                log_prob=log_prob,
                advantages=inputs["advantages"],
                response_mask=inputs["response_mask"],
                loss_agg_mode=config.loss_agg_mode,
                config=config,
                rollout_is_weights=None,
            )
            loss.backward()

        return step

    return {name: build(name) for name in METHODS}, log_prob


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_step(step: Callable[[], None], log_prob: torch.Tensor, device: torch.device) -> float:
    # A gradient left over from the previous call would turn this call's gradient write into an add.
    log_prob.grad = None
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - start


def _cpu_peak_bytes(fn: Callable[[], None]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events = [e for e in events if e.device_type() == torch.autograd.DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def check_cpu_peak_method() -> None:
    """The profiler-based peak must see a known transient allocation exactly, or the numbers mean nothing."""
    size = 3 * 1024 * 1024

    def known():
        a = torch.empty(size, dtype=torch.uint8)
        b = torch.empty(size, dtype=torch.uint8)
        del a, b
        c = torch.empty(size, dtype=torch.uint8)
        del c

    peak = _cpu_peak_bytes(known)
    if peak != 2 * size:
        raise SystemExit(f"CPU peak-memory method is unreliable here: saw {peak} bytes, expected {2 * size}")


def peak_bytes(step: Callable[[], None], log_prob: torch.Tensor, device: torch.device) -> int:
    log_prob.grad = None
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    return _cpu_peak_bytes(step)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False here")
    return torch.device(name)


def bench_device(device: torch.device, args: argparse.Namespace) -> dict:
    # Other processes on the machine slow torch's multi-threaded ops unevenly; the load shows whether they ran.
    load = os.getloadavg()[0]
    inputs = make_inputs(args.batch, args.length, device, args.seed)
    methods, log_prob = make_methods(inputs, args.batch)

    for name, step in methods.items():  # first calls pay one-off costs (kernels, allocator growth)
        time_step(step, log_prob, device)

    samples: dict[str, list[float]] = {name: [] for name in METHODS}
    for rnd in range(args.repeats):
        order = METHODS[rnd % len(METHODS):] + METHODS[: rnd % len(METHODS)]
        for name in order:
            seconds = time_step(methods[name], log_prob, device)
            samples[name].append(seconds)
            log(f"[{device.type}] round {rnd + 1}/{args.repeats} {name:<8} {seconds * 1e3:9.2f} ms")

    if device.type == "cpu":
        check_cpu_peak_method()
    peaks: dict[str, int] = {}
    for name in METHODS:
        # Allocation is deterministic for a given input, so two runs must agree; a mismatch is reported.
        first, second = (peak_bytes(methods[name], log_prob, device) for _ in range(2))
        if first != second:
            log(f"[{device.type}] warning: peak memory of {name} differs between runs ({first} vs {second})")
        peaks[name] = max(first, second)
        log(f"[{device.type}] peak memory {name:<8} {peaks[name] / 2**20:9.2f} MiB")

    medians = {name: statistics.median(s) for name, s in samples.items()}
    return {
        "device": str(device),
        "loadavg_1min": load,
        "samples_s": samples,
        "median_s": medians,
        "peak_bytes": peaks,
        "ratios": {
            "apo/sapo time": medians["apo"] / medians["sapo"],
            "apo/vanilla time": medians["apo"] / medians["vanilla"],
            "apo/vanilla peak memory": peaks["apo"] / peaks["vanilla"],
            "apo/sapo peak memory": peaks["apo"] / peaks["sapo"],
            "apo_one_sided/vanilla time": medians["apo_one_sided"] / medians["vanilla"],
            "apo_one_sided/vanilla peak memory": peaks["apo_one_sided"] / peaks["vanilla"],
        },
    }


def render(result: dict, args: argparse.Namespace) -> str:
    med, peaks, device = result["median_s"], result["peak_bytes"], result["device"]
    bytes_per_token = {name: peaks[name] / (args.batch * args.length) for name in METHODS}
    lines = [
        f"Policy losses, forward + backward on {device}, {args.batch} x {args.length}, "
        f"{args.repeats} interleaved repeats, torch {torch.__version__}"
        + (f", {torch.get_num_threads()} threads, 1-min load average {result['loadavg_1min']:.2f} at the start"
           if device == "cpu" else ""),
        "",
        "| loss | loss_agg_mode | median ms | apo time / this | peak MiB | apo peak / this | bytes / token |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in METHODS:
        lines.append(
            f"| {name} | {AGG_MODES[name]} | {med[name] * 1e3:.2f} | {med['apo'] / med[name]:.3f}x "
            f"| {peaks[name] / 2**20:.2f} | {peaks['apo'] / peaks[name]:.3f}x | {bytes_per_token[name]:.1f} |"
        )
    time_ratio = result["ratios"]["apo/sapo time"]
    mem_ratio = result["ratios"]["apo/vanilla peak memory"]
    lines += [
        "",
        f"apo/sapo time          = {time_ratio:.3f}x (target <= {TIME_TARGET}x): "
        f"{'met' if time_ratio <= TIME_TARGET else 'MISSED'}",
        f"apo/vanilla peak memory = {mem_ratio:.3f}x (target <= {MEMORY_TARGET}x): "
        f"{'met' if mem_ratio <= MEMORY_TARGET else 'MISSED'}",
        f"(apo/vanilla time = {result['ratios']['apo/vanilla time']:.3f}x, "
        f"apo/sapo peak memory = {result['ratios']['apo/sapo peak memory']:.3f}x; apo_one_sided/vanilla time = "
        f"{result['ratios']['apo_one_sided/vanilla time']:.3f}x, peak memory = "
        f"{result['ratios']['apo_one_sided/vanilla peak memory']:.3f}x)",
    ]
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="responses in the micro-batch")
    parser.add_argument("--length", type=int, default=4096, help="response length (padded width)")
    parser.add_argument("--repeats", type=int, default=100, help="timed calls per loss")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: CPU, then CUDA too when torch.cuda.is_available()")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the results as JSON to this path")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators and losses)

    if args.device == "auto":
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    else:
        devices = [resolve_device(args.device)]

    results = []
    for device in devices:
        result = bench_device(device, args)
        results.append(result)
        print("\n" + render(result, args), flush=True)

    if args.out:
        payload = {
            "benchmark": "policy_loss",
            "args": vars(args),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "agg_modes": AGG_MODES,
            "targets": {"apo/sapo time": TIME_TARGET, "apo/vanilla peak memory": MEMORY_TARGET},
            "results": results,
        }
        with open(args.out, "w") as fh:
            json.dump(payload, fh, indent=2)
        log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
