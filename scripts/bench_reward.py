"""Benchmark: the recipe's math reward against verl's own ``math_verify`` scorer, under load.

1,024 MATH-style responses (correct answers in several forms, wrong answers, malformed ones with no or an
unclosed box) plus a few hostile answers (``9^{9^{9}}``, ``10^{10^{10}}``, ``(10^8)!``), scored the way verl's
reward loop calls a custom reward: from several threads at once. Two rounds per scorer:

- benign: the 1,024 responses; responses per second and the slowest call;
- hostile: 8 hostile answers among 56 benign ones; the slowest call, and for the recipe the longest check of
  one answer, which is what ``RECIPE_APO_REWARD_TIMEOUT`` bounds (a call may also wait for a free worker).

Both scorers get the same number of worker processes (verl's is fixed at 4) and the same timeout. verl's
scorer parses the whole response while the recipe's takes the last box, so their scores can differ; the
agreement is printed. Targets: the recipe no slower than verl's scorer on benign answers, and no check longer
than the timeout on hostile ones.

Run from the repository root::

    .venv/bin/python scripts/bench_reward.py             # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

WORKERS = 4  # verl's math_verify scorer always runs 4 processes
HOSTILE = ["9^{9^{9}}", "10^{10^{10}}", "(10^8)!", "2^{2^{2^{2^{2^{2}}}}}"]
# (ground truth, answers that are right, answers that are wrong)
PROBLEMS = [
    ("\\frac{1}{2}", ["\\frac{1}{2}", "0.5", "1/2", "\\dfrac{1}{2}"], ["\\frac{1}{3}", "2"]),
    ("2\\sqrt{3}", ["2\\sqrt{3}", "\\sqrt{12}"], ["3\\sqrt{2}", "2\\sqrt{2}"]),
    ("12", ["12", "12.0", "\\text{12}"], ["13", "-12"]),
    ("(1, 2)", ["(1,2)", "(1, 2)"], ["(2, 1)"]),
    ("x^2 + 1", ["x^2+1", "1 + x^2"], ["x^2 - 1"]),
    ("\\pi", ["\\pi"], ["3.14", "2\\pi"]),
    ("50\\%", ["50", "50\\%"], ["0.5"]),
    ("\\frac{\\sqrt{5}}{5}", ["\\frac{1}{\\sqrt{5}}", "\\frac{\\sqrt{5}}{5}"], ["\\sqrt{5}"]),
]
MALFORMED = ["The answer is 12.", "\\boxed{12", "\\boxed{}", "so we get \\boxed"]


def responses(n: int, hostile: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (response, ground truth) pairs, ``hostile`` of them hostile, shuffled."""
    rng = random.Random(seed)
    items = []
    for _ in range(n - hostile):
        truth, right, wrong = rng.choice(PROBLEMS)
        kind = rng.random()
        if kind < 0.45:
            answer = f"\\boxed{{{rng.choice(right)}}}"
        elif kind < 0.9:
            answer = f"\\boxed{{{rng.choice(wrong)}}}"
        else:
            answer = rng.choice(MALFORMED)
        items.append((f"Step by step, we find the value. Therefore the answer is {answer}", truth))
    items += [(f"The answer is \\boxed{{{rng.choice(HOSTILE)}}}", "1") for _ in range(hostile)]
    rng.shuffle(items)
    return items


def timed(score, items, threads: int) -> tuple[list[float], list[float], float]:
    """Scores, per-call seconds and wall seconds, calling ``score`` from ``threads`` threads at once."""
    def call(item):
        started = time.monotonic()
        value = score(*item)
        return value, time.monotonic() - started

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as executor:
        results = list(executor.map(call, items))
    return [r[0] for r in results], [r[1] for r in results], time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--responses", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=8, help="threads calling the scorer at once (default 8)")
    parser.add_argument("--timeout", type=float, default=10.0, help="both scorers' timeout in seconds (default 10)")
    args = parser.parse_args()
    os.environ["RECIPE_APO_REWARD_WORKERS"] = str(WORKERS)

    from verl.utils.reward_score import math_verify as verl_math_verify

    from recipe_apo import reward
    from recipe_apo.reward import pool

    scorers = {
        "recipe_apo.reward": lambda text, truth: reward.compute_score("math500", text, truth, timeout=args.timeout),
        "verl math_verify": lambda text, truth: float(verl_math_verify.compute_score(text, truth,
                                                                                     timeout=args.timeout)),
    }
    benign = responses(args.responses, hostile=0)
    mixed = responses(64, hostile=8, seed=1)
    rows, benign_scores = {}, {}
    for name, score in scorers.items():
        score(*benign[0])  # start the scorer's worker processes first: start-up is not what is measured
        scores, calls, wall = timed(score, benign, args.threads)
        benign_scores[name] = scores
        _, hostile_calls, hostile_wall = timed(score, mixed, args.threads)
        rows[name] = (len(benign) / wall, max(calls), max(hostile_calls), hostile_wall)
        print(f"{name}: done", file=sys.stderr, flush=True)
    longest_check = pool._pool().longest_check_s

    print(f"\n{len(benign)} benign responses and 64 with 8 hostile, {args.threads} threads, {WORKERS} worker "
          f"processes each, timeout {args.timeout:g} s\n")
    print("| scorer | benign: responses/s | benign: slowest call | hostile: slowest call | hostile: wall |")
    print("|---|---|---|---|---|")
    for name, (rate, slowest, hostile_slowest, hostile_wall) in rows.items():
        print(f"| {name} | {rate:.0f} | {slowest:.2f} s | {hostile_slowest:.2f} s | {hostile_wall:.1f} s |")
    ours, verls = rows["recipe_apo.reward"], rows["verl math_verify"]
    agree = sum(a == b for a, b in zip(*benign_scores.values())) / len(benign)
    print(f"\nbenign throughput, recipe / verl: {ours[0] / verls[0]:.2f}x (target >= 1.0x: "
          f"{'met' if ours[0] >= verls[0] else 'missed'}); scores agree on {agree:.1%} of benign responses")
    print(f"longest check of one answer (what the timeout bounds): {longest_check:.2f} s "
          f"(target <= {args.timeout:g} s: "
          f"{'met' if longest_check <= args.timeout + 0.5 else 'missed'})")
    pool.shutdown()
    # verl's pool keeps computing timed-out answers; end its processes rather than wait for them.
    pool = verl_math_verify._pool
    if pool is not None:
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
