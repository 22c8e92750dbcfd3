"""The audit of one run: the four biases of APO's paper, measured on its rollouts, for GRPO, Dr. GRPO and APO.

Every method is applied to the same rollouts (the run's own scores and groups), whatever method the run
trained with, so the numbers say what each method would have done with them. APO's anchor is replayed over the
steps in order from a fresh start, with the run's ``algorithm.apo`` settings (or the defaults). Statistics are
``recipe_apo.audit.stats``'s, shared with the CPU testbed.

The result is a plain dict (JSON-safe), so that the report, the tests and ``audit.json`` read the same numbers:

- ``steps``: per step, the dead-group share and token share, the success rate, lengths of correct and incorrect
  responses, the truncation share, and per method the share of update mass on short-correct and long-wrong
  responses and the largest |A|;
- ``dead``: over the run; ``difficulty``: groups pooled over the run by p_hat (k/G), with S+ and S- per method
  beside p (1 - p) (G - 1); ``length``: over the run; ``mass``: per method, the 2x2 shares (correct or not,
  shorter than the step's median length or not); ``scale``: per method, |A| mean, 99th percentile and max;
- ``logged``: when the dump carries the run's own advantages (the recipe's trainer), which methods' replays
  reproduce them (all three when no group had a signal) and the largest difference to each.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from recipe_apo.audit import stats
from recipe_apo.audit.dumps import AuditError, Run, Step, check_data_sources
from recipe_apo.methods.apo_settings import ApoSettings
from recipe_apo.methods.driver_state import reset_driver_anchors
from recipe_apo.methods.errors import BatchInputError
from recipe_apo.methods.success import success_of

CELLS = ("short_correct", "long_correct", "short_wrong", "long_wrong")
# A replay matches the run's logged advantages when no response differs by more than this (float32 rounding).
MATCH_TOLERANCE = 1e-4


def _finite(value: float) -> Optional[float]:
    return None if value is None or not math.isfinite(value) else float(value)


def _cells(correct: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
    """The 2x2 split of a step's responses: correct or not, and no longer than the step's median length or not."""
    short = lengths <= np.median(lengths)
    return {"short_correct": correct & short, "long_correct": correct & ~short,
            "short_wrong": ~correct & short, "long_wrong": ~correct & ~short}


def _successes(step: Step, settings: ApoSettings) -> np.ndarray:
    """s_i of the step's scores; a score the success rule does not take is refused naming its row."""
    try:
        return success_of(step.scores, settings)
    except BatchInputError:
        pass

    def refused(score: float) -> bool:  # the rule's own check, one score at a time (only on this error path)
        try:
            success_of(np.array([score]), settings)
        except BatchInputError:
            return True
        return False

    outside = [row for row, score in enumerate(step.scores) if refused(score)]
    raise AuditError(f"{step.where(outside[0])}: score {step.scores[outside[0]]:.6g} is outside the rewards "
                     f"algorithm.apo.success={settings.success} takes ({len(outside)} of the step's rows); replay "
                     "with --apo success=threshold --apo success_threshold=T, or success=minmax with success_min "
                     "and success_max")


def _replayed(step: Step, method: stats.Method, apo: dict, scopes: Any) -> np.ndarray:
    """``method``'s advantages on ``step``; a step the estimator refuses, or whose advantages overflow, is
    refused naming its file (and the row)."""
    try:
        advantages = stats.method_advantages(step.scores, step.groups, method, apo, scopes)
    except BatchInputError as exc:  # its rows are the step's rows: the file tells which step
        raise AuditError(f"{step.path}: {method.name}'s replay: {exc}") from None
    bad = np.flatnonzero(~np.isfinite(advantages))
    if bad.size:
        # verl computes advantages in float32: scores near its range overflow the group's mean or std.
        raise AuditError(f"{step.where(bad[0])}: {method.name}'s replayed advantage is not a finite number (nor "
                         f"are {bad.size - 1} more of the step's): scores up to {np.abs(step.scores).max():.3g} "
                         "overflow the float32 verl computes advantages in")
    return advantages


def audit_run(run: Run, apo: Optional[dict] = None, l0: float = 1.0) -> dict[str, Any]:
    """The audit's numbers for ``run`` (see the module docstring). ``apo``: ``algorithm.apo`` settings for the
    replay. ``l0`` only scales per-token weights; the shares reported do not depend on it."""
    settings = ApoSettings.from_algorithm_config({"apo": dict(apo or {})})
    apo_node = dict(apo or {})
    scoped = settings.anchor_scope == "data_source"
    if scoped:
        check_data_sources(run, "the replay with anchor_scope=data_source")
    steps_out, pooled = [], {m.name: [] for m in stats.METHODS}
    groups_pooled: list[dict[str, Any]] = []
    mass_totals = {m.name: dict.fromkeys(CELLS, 0.0) for m in stats.METHODS}
    dead_count = group_count = dead_tokens = all_tokens = 0.0
    all_wrong = all_right = 0
    lengths_right, lengths_wrong, truncated_flags = [], [], []
    logged_gap = {m.name: 0.0 for m in stats.METHODS}
    has_logged = all(step.logged_advantages is not None for step in run.steps)
    has_lags = all(step.policy_lag is not None for step in run.steps)
    lag_counts: dict[int, int] = {}
    lag_mass = {m.name: {} for m in stats.METHODS}

    reset_driver_anchors()  # APO's replay starts from a fresh anchor, as the run did
    try:
        for step in run.steps:
            codes, n_groups = stats.group_codes(step.groups)
            success = _successes(step, settings)
            correct = success >= 0.5
            p_hat = stats.group_rates(codes, n_groups, success)
            sizes = np.bincount(codes, minlength=n_groups)
            dead = stats.dead_groups(step.scores, codes, n_groups)
            lengths = step.lengths
            dead_group_tokens = float(lengths[dead[codes]].sum())
            cells = _cells(correct, lengths)
            right, wrong = stats.length_by_outcome(lengths, correct)
            entry: dict[str, Any] = {
                "step": step.step, "responses": int(len(step.scores)), "groups": int(n_groups),
                "success": float(success.mean()), "dead_share": float(dead.mean()),
                "dead_token_share": dead_group_tokens / max(float(lengths.sum()), 1e-12),
                "length_correct": _finite(right), "length_incorrect": _finite(wrong),
                "truncated_share": None if step.truncated is None else float(step.truncated.mean()),
                "methods": {},
            }
            dead_count += float(dead.sum())
            group_count += n_groups
            dead_tokens += dead_group_tokens
            all_tokens += float(lengths.sum())
            all_wrong += int((dead & (p_hat == 0)).sum())
            all_right += int((dead & (p_hat == 1)).sum())
            lengths_right.append(lengths[correct])
            lengths_wrong.append(lengths[~correct])
            if step.truncated is not None:
                truncated_flags.append(step.truncated)

            if has_lags:
                for lag, count in zip(*np.unique(step.policy_lag, return_counts=True)):
                    lag_counts[int(lag)] = lag_counts.get(int(lag), 0) + int(count)
            per_group = {"p_hat": p_hat, "size": sizes}
            for method in stats.METHODS:
                scopes = step.data_sources if (scoped and method.adv_estimator == "apo") else None
                advantages = _replayed(step, method, apo_node, scopes)
                positive, negative = stats.signal_per_group(advantages, codes, n_groups)
                per_group[method.name] = (positive, negative)
                mass = stats.update_mass(advantages, lengths, method.loss_agg_mode, l0)
                total = float(mass.sum())
                shares = {cell: (float(mass[mask].sum()) / total if total > 0 else 0.0)
                          for cell, mask in cells.items()}
                for cell in CELLS:
                    mass_totals[method.name][cell] += float(mass[cells[cell]].sum())
                if has_lags:
                    by_lag = np.bincount(step.policy_lag, weights=mass)
                    for lag in np.flatnonzero(np.bincount(step.policy_lag)):
                        lag_mass[method.name][int(lag)] = lag_mass[method.name].get(int(lag), 0.0) + by_lag[lag]
                entry["methods"][method.name] = {"max_abs_advantage": float(np.abs(advantages).max()), **shares}
                pooled[method.name].append(np.abs(advantages))
                if has_logged:
                    gap = np.abs(advantages - step.logged_advantages)
                    logged_gap[method.name] = max(logged_gap[method.name], float(gap.max()))
            groups_pooled.append(per_group)
            steps_out.append(entry)
    finally:
        reset_driver_anchors()

    result = {
        "name": run.name, "folder": str(run.folder), "length_unit": run.length_unit,
        "apo_settings": dataclasses.asdict(settings),
        "steps": steps_out,
        "dead": {
            "share": dead_count / max(group_count, 1), "token_share": dead_tokens / max(all_tokens, 1e-12),
            "all_wrong_share": all_wrong / max(group_count, 1), "all_right_share": all_right / max(group_count, 1),
            "groups": int(group_count),
        },
        "difficulty": _difficulty(groups_pooled),
        "length": _length_summary(lengths_right, lengths_wrong, truncated_flags),
        "mass": {name: _normalized(cells) for name, cells in mass_totals.items()},
        "scale": {name: _scale(np.concatenate(values)) for name, values in pooled.items()},
    }
    if has_lags:
        responses = sum(lag_counts.values())
        result["staleness"] = {
            "response_share": {lag: count / responses for lag, count in sorted(lag_counts.items())},
            "mass": {name: _normalized(dict(sorted(by_lag.items()))) for name, by_lag in lag_mass.items()},
        }
    if has_logged:
        # Several methods match when no group had a signal (all advantages 0 under every method).
        result["logged"] = {"max_abs_difference": logged_gap,
                            "matches": [name for name, gap in logged_gap.items() if gap <= MATCH_TOLERANCE]}
    return result


def _normalized(cells: dict[str, float]) -> dict[str, float]:
    total = sum(cells.values())
    return {cell: (value / total if total > 0 else 0.0) for cell, value in cells.items()}


def _scale(values: np.ndarray) -> dict[str, float]:
    return {"mean": float(values.mean()), "p99": float(np.percentile(values, 99)), "max": float(values.max())}


def _length_summary(right: list[np.ndarray], wrong: list[np.ndarray], truncated: list[np.ndarray]) -> dict:
    right_all, wrong_all = np.concatenate(right), np.concatenate(wrong)
    return {
        "correct_mean": _finite(float(right_all.mean())) if right_all.size else None,
        "incorrect_mean": _finite(float(wrong_all.mean())) if wrong_all.size else None,
        "truncated_share": float(np.concatenate(truncated).mean()) if truncated else None,
    }


def _difficulty(per_step: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups pooled over the run by (G, p_hat = k/G): count, mean S+ and S- per method, p(1-p)(G-1)."""
    p_hat = np.concatenate([g["p_hat"] for g in per_step])
    sizes = np.concatenate([g["size"] for g in per_step])
    k = np.rint(p_hat * sizes).astype(np.int64)
    rows = []
    for size in np.unique(sizes):
        for successes in range(int(size) + 1):
            mask = (sizes == size) & (k == successes)
            if not mask.any():
                continue
            p = successes / int(size)
            row: dict[str, Any] = {"G": int(size), "k": successes, "p_hat": p, "groups": int(mask.sum()),
                                   "closed_form": float(stats.closed_form(p, int(size)))}
            for method in stats.METHODS:
                positive = np.concatenate([g[method.name][0] for g in per_step])
                negative = np.concatenate([g[method.name][1] for g in per_step])
                row[method.name] = {"positive": float(positive[mask].mean()), "negative": float(negative[mask].mean())}
            rows.append(row)
    return rows
