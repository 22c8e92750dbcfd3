"""The paired statistics of the testbed's reports.

Every comparison is paired: a method's number minus another's on the same seed (same initial weights, same
prompts). A difference counts as more than seed noise only when every seed agrees on its sign and a paired
t-test clears the two-sided 5% level; the reports say "within seed noise" otherwise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from recipe_apo.testbed.settings import PAIRED_METRICS


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below the mean; use the symmetry
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, c, d = 1e-300, 1.0, 0.0
    f = None
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + numerator * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + numerator / (c if abs(c) > tiny else tiny)
        f = c * d if f is None else f * c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * (f - 1.0)


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    return _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_critical(df: int, level: float = 0.05) -> float:
    """The two-sided critical value of Student's t at ``level``, for any ``df`` (bisection on the p-value)."""
    low, high = 0.0, 1e3
    for _ in range(200):
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_two_sided_p(mid, df) > level else (low, mid)
    return (low + high) / 2.0


# The metrics compared pair by pair.
PAIRED = list(PAIRED_METRICS)  # settings.PAIRED_METRICS: league.metric is one of them


def nanmean(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def nanstd(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.std(ddof=1)) if values.size > 1 else float("nan")



def paired(values_a: list[float], values_b: list[float]) -> dict[str, Any]:
    """a - b per seed, with how many seeds agree on the sign and whether it clears seed noise.

    A seed where either value is missing (NaN, e.g. a length when no response was correct) is counted as
    missing, and a difference with any seed missing is never called beyond seed noise.
    """
    diff = np.asarray(values_a, dtype=np.float64) - np.asarray(values_b, dtype=np.float64)
    n = int(np.isfinite(diff).sum())
    missing = int(diff.size - n)
    d = diff[np.isfinite(diff)]
    mean = float(d.mean()) if n else float("nan")
    std = float(d.std(ddof=1)) if n > 1 else float("nan")
    positive, negative = int((d > 0).sum()), int((d < 0).sum())
    agree = max(positive, negative)
    # Fewer than 3 seeds cannot tell a difference from noise, whatever the numbers say.
    if n >= 3 and std > 0:
        t = mean / (std / math.sqrt(n))
        significant = abs(t) > t_critical(n - 1) and agree == n and missing == 0
    else:
        t, significant = float("nan"), bool(n >= 3 and std == 0 and mean != 0 and missing == 0)
    return {
        "per_seed": [float(x) for x in diff],
        "mean": mean,
        "std": std,
        "t": t,
        "seeds_agree": agree,
        "seeds": n,
        "seeds_missing": missing,
        "direction": "+" if positive > negative else ("-" if negative > positive else "0"),
        "beyond_seed_noise": bool(significant),
    }


def paired_between(summary: dict[str, Any], a: str, b: str, metric: str) -> dict[str, Any]:
    """``paired`` of ``a - b`` on ``metric`` from a summary, whichever order the pair is stored in ("x - y"
    once per pair; which label comes first says the sign, not a name prefix: "x" is a prefix of "x_b")."""
    key = f"{a} - {b}"
    if key in summary["paired"]:
        return summary["paired"][key][metric]
    p = dict(summary["paired"][f"{b} - {a}"][metric])
    for name in ("mean", "t"):
        if name in p:
            p[name] = -p[name]
    if "per_seed" in p:
        p["per_seed"] = [-x for x in p["per_seed"]]
    if "direction" in p:
        p["direction"] = {"+": "-", "-": "+"}.get(p["direction"], p["direction"])
    return p



def compare_runs(
    per_run: dict[str, dict[str, dict[str, float]]], labels: list[str], seeds: list[int], metrics: list[str] = PAIRED
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(aggregate, comparisons) of summary.json from per-run numbers (label -> seed -> key -> value): mean and
    std over seeds of every key, and ``paired`` of every pair of labels on ``metrics``, stored once per pair as
    "a - b" with the later label first (``paired_between`` reads either order)."""
    aggregate = {}
    for label in labels:
        keys = next(iter(per_run[label].values())).keys()
        aggregate[label] = {
            key: {
                "mean": nanmean([per_run[label][str(s)][key] for s in seeds]),
                "std": nanstd([per_run[label][str(s)][key] for s in seeds]),
            }
            for key in keys
        }
    comparisons = {}
    for i, a in enumerate(labels):
        for b in labels[:i]:
            # Later labels first: each method against the baseline listed first reads "<method> - <baseline>".
            comparisons[f"{a} - {b}"] = {
                key: paired([per_run[a][str(s)][key] for s in seeds], [per_run[b][str(s)][key] for s in seeds])
                for key in metrics
            }
    return aggregate, comparisons
