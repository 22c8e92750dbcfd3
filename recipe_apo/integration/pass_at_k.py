"""Chen et al. (2021)'s unbiased pass@k, and the validation metrics that log it beside verl's ``best@k``.

verl 0.9.1's validation (``verl.trainer.ppo.metric_utils.process_validation_metrics``) logs, per data source and
reward variable, ``best@k/mean``: the mean over problems of the best of k samples drawn *with replacement* from a
problem's n samples, estimated from 1,000 bootstrap draws. Drawing with replacement repeats samples, so for a
0/1 variable it estimates 1 - (1 - c/n)^k, biased low against pass@k (verl issue #7240: one right sample of four
reads 0.684 = 1 - (3/4)^4 at k = 4, where every draw of four of the four samples holds the right one), with
Monte-Carlo noise on top.

Symbols: a problem has ``n`` samples, ``c`` of them right; pass@k is the chance that ``k`` of the n samples,
drawn without replacement, hold a right one:

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{j=0}^{k-1} (n - c - j) / (n - j)

computed as that product (every factor in [0, 1]: no factorials, no overflow at any n); a factor reaches 0 when
fewer than k samples are wrong, and the product stays 0 after it.

``validation_metrics`` gives ``val-core/<data_source>/<var>/pass@k/mean`` (and ``val-aux/...``) from the lists
verl's V1 trainer hands ``_val_metrics_update``; the recipe's trainer adds them to verl's own
(``RecipeHooks._val_metrics_update``). numpy only.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np


def pass_at_k(n: Any, c: Any, k: int) -> np.ndarray:
    """pass@k of problems with ``n`` samples of which ``c`` are right (arrays, or numbers; broadcast), as float64.
    ValueError when k < 1, a problem has fewer than k samples, or c is outside [0, n]."""
    n, c = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64))
    if k < 1:
        raise ValueError(f"pass@{k}: k must be 1 or more")
    if n.size and n.min() < k:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {int(n.min())}")
    if n.size and ((c < 0) | (c > n)).any():
        bad = np.flatnonzero(((c < 0) | (c > n)).ravel())[0]
        raise ValueError(f"pass@{k}: {int(c.ravel()[bad])} right of {int(n.ravel()[bad])} samples")
    j = np.arange(k)
    # (..., k): the chance that draw j is wrong when the j before it were, each in [0, 1] until one is 0
    wrong_draws = (n[..., None] - c[..., None] - j) / (n[..., None] - j)
    return 1.0 - np.maximum(wrong_draws, 0.0).prod(axis=-1)


def ks_beside_best(n: int) -> list[int]:
    """The k verl 0.9.1 logs ``best@k`` at for n samples: the powers of two below n, then n (none for n = 1)."""
    if n <= 1:
        return []
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def _numbers(values: Sequence[Any], count: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """A variable's values as float64 (0 where verl gave None) and where one was given; None when they are not
    numbers (a text, a list) or not one per sample."""
    if len(values) != count or any(isinstance(v, (str, bytes)) for v in values):
        return None
    try:
        array = np.array([0.0 if v is None else float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return array, np.array([v is not None for v in values], dtype=bool)


# The variables whose 1 means a right answer: verl's ``acc`` and the reward under its two names. Other 0/1
# variables a reward function returns (``truncated``, a format flag) are not answers: a pass@k of them means nothing.
ANSWER_VARIABLES = ("acc", "reward", "score")


def validation_metrics(data_sources: Sequence[Any], sample_uids: Sequence[Any], infos_dict: dict[str, Sequence[Any]],
                       expected_acc_counts: Optional[dict[tuple[str, str], int]] = None) -> dict[str, float]:
    """``<section>/<data_source>/<var>/pass@k/mean``: the mean over a data source's problems (samples grouped by
    uid) of pass@k, for every answer variable (``ANSWER_VARIABLES``) whose values there are all 0 or 1 (None: no
    value), at the k verl logs ``best@k`` at (``ks_beside_best``; each k over the problems with at least k samples).

    As verl does: ``val-core`` for the data source's core variable (``acc`` where it has one, else ``reward``) at
    its largest k, ``val-aux`` otherwise; with ``expected_acc_counts`` ((data source, uid) -> samples asked for),
    an ``acc`` session that failed counts as a wrong sample. A variable that is not right/wrong gets none."""
    count = len(data_sources)
    problems: dict[tuple[str, str], int] = {}
    problem_of = np.fromiter((problems.setdefault((str(s), str(u)), len(problems))
                              for s, u in zip(data_sources, sample_uids, strict=True)), dtype=np.int64, count=count)
    sample_source = np.array([str(s) for s in data_sources], dtype=object)
    acc_sources = set()
    if "acc" in infos_dict and len(infos_dict["acc"]) == count:
        acc_sources = {s for s, v in zip(sample_source, infos_dict["acc"]) if v is not None}
    expected = {}
    for (source, uid), asked in (expected_acc_counts or {}).items():
        if str(source) in acc_sources:  # verl adds failed sessions only where the source emits acc
            expected[problems.setdefault((str(source), str(uid)), len(problems))] = int(asked)
    problem_source = np.array([source for source, _ in problems], dtype=object)

    metrics = {}
    for var, values in infos_dict.items():
        if var not in ANSWER_VARIABLES:
            continue
        numbers = _numbers(values, count)
        if numbers is None:
            continue
        array, given = numbers
        right_or_wrong = np.isin(array, (0.0, 1.0))
        n = np.bincount(problem_of[given], minlength=len(problems))
        c = np.bincount(problem_of[given], weights=array[given] == 1.0, minlength=len(problems)).astype(np.int64)
        if var == "acc" and expected:
            at = np.fromiter(expected, dtype=np.int64)
            n[at] = np.maximum(n[at], np.fromiter(expected.values(), dtype=np.int64))
        for source in dict.fromkeys(sample_source[given]):
            if not right_or_wrong[given & (sample_source == source)].all():
                continue  # a graded variable (a reward of 0.5, a length) or NaN: pass@k does not apply
            here = (problem_source == source) & (n > 0)
            largest = int(n[here].max())
            core = var == ("acc" if source in acc_sources else "reward")
            for k in sorted({k for size in np.unique(n[here]) for k in ks_beside_best(int(size))}):
                rows = here & (n >= k)
                section = "val-core" if core and k == largest else "val-aux"
                metrics[f"{section}/{source}/{var}/pass@{k}/mean"] = float(pass_at_k(n[rows], c[rows], k).mean())
    return metrics
