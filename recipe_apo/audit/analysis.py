"""The audit of one run: the four biases of APO's paper, measured on its rollouts, for GRPO, Dr. GRPO and APO.

Every method is applied to the same rollouts (the run's own scores, lengths and groups), whatever method the run
trained with, so the numbers say what each method would have done with them: each estimator is handed a response
mask as long as each response (``Step.estimator_lengths``), so AGPO's replay has its length bonus, and the
preset's own settings (``recipe_apo.integration.replay``). APO's anchor is replayed over the
steps in order from a fresh start, with the run's ``algorithm.apo`` settings (or the defaults). The statistics
are ``recipe_apo.methods.group_stats``'s and the replays ``recipe_apo.integration.replay``'s, shared with the CPU
testbed, so that S means the same in both reports.

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

from recipe_apo.audit.dumps import AuditError, Run, Step, check_data_sources
from recipe_apo.integration.replay import MAX_MASK_CELLS, Method, method_advantages, methods
from recipe_apo.methods.apo.anchor import reset_driver_anchors
from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.apo.success import success_of
from recipe_apo.methods.errors import BatchInputError
from recipe_apo.methods.group_stats import closed_form, dead_groups, length_by_outcome, signal_per_group, update_mass
from recipe_apo.methods.groups import group_codes, group_rates

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


def _replayed(step: Step, method: Method, apo: dict, scopes: Any) -> np.ndarray:
    """``method``'s advantages on ``step``; a step the estimator refuses, or whose advantages overflow, is
    refused naming its file (and the row)."""
    try:
        advantages = method_advantages(step.scores, step.groups, method, apo, scopes, lengths=step.estimator_lengths)
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
    totals = _RunTotals(run)
    reset_driver_anchors()  # APO's replay starts from a fresh anchor, as the run did
    try:
        for step in run.steps:
            outcomes = _outcomes(step, settings)
            replays = _replay_step(step, apo_node, scoped)
            totals.add(step, outcomes, {name: _measure(advantages, method, outcomes, l0)
                                        for name, (method, advantages) in replays.items()})
    finally:
        reset_driver_anchors()
    return totals.result(run, settings)


@dataclasses.dataclass(frozen=True)
class _Outcomes:
    """One step's responses as every method sees them: their groups, successes and lengths."""

    codes: np.ndarray  # the group of each response, 0 .. n_groups - 1
    n_groups: int
    success: np.ndarray  # s_i
    correct: np.ndarray  # s_i >= 0.5
    p_hat: np.ndarray  # per group: mean s_i
    sizes: np.ndarray  # per group: G
    dead: np.ndarray  # per group: every score equal
    lengths: np.ndarray
    cells: dict[str, np.ndarray]  # the 2x2 split (``CELLS``)


def _outcomes(step: Step, settings: ApoSettings) -> _Outcomes:
    codes, n_groups = group_codes(step.groups)
    success = _successes(step, settings)
    correct = success >= 0.5
    return _Outcomes(codes=codes, n_groups=n_groups, success=success, correct=correct,
                     p_hat=group_rates(codes, n_groups, success), sizes=np.bincount(codes, minlength=n_groups),
                     dead=dead_groups(step.scores, codes, n_groups), lengths=step.lengths,
                     cells=_cells(correct, step.lengths))


def _replay_step(step: Step, apo: dict, scoped: bool) -> dict[str, tuple[Method, np.ndarray]]:
    """Each method's advantages on ``step``, replayed in ``methods()``'s order (APO's anchor advances once per
    step). With ``anchor_scope=data_source`` APO's anchor is kept per response's data source; the other
    estimators take no scopes."""
    _check_replay_size(step)
    replays = {}
    for method in methods():
        scopes = step.data_sources if (scoped and method.adv_estimator == "apo") else None
        replays[method.name] = (method, _replayed(step, method, apo, scopes))
    return replays


def _check_replay_size(step: Step) -> None:
    """Refuse a step whose replay would lay out more than ``MAX_MASK_CELLS`` mask cells (its responses times
    its longest response's tokens), naming the longest response: the dump's lengths size the allocation."""
    lengths = step.estimator_lengths
    longest = int(np.argmax(lengths))
    width = max(float(lengths[longest]), 1.0)
    if lengths.size * width > MAX_MASK_CELLS:
        raise AuditError(f"{step.where(longest)}: a response of length {lengths[longest]:.0f}: the replay would "
                         f"lay the step's {lengths.size} responses out as a mask of {lengths.size} x "
                         f"{lengths[longest]:.0f} tokens, beyond the {MAX_MASK_CELLS} cells it allocates")


@dataclasses.dataclass(frozen=True)
class _Measures:
    """One method's biases on one step."""

    advantages: np.ndarray
    positive: np.ndarray  # S+ per group
    negative: np.ndarray  # S- per group
    mass: np.ndarray  # update mass per response
    shares: dict[str, float]  # the step's update mass per cell of ``CELLS``, as a share


def _measure(advantages: np.ndarray, method: Method, outcomes: _Outcomes, l0: float) -> _Measures:
    positive, negative = signal_per_group(advantages, outcomes.codes, outcomes.n_groups)
    mass = update_mass(advantages, outcomes.lengths, method.loss_agg_mode, l0)
    total = float(mass.sum())
    shares = {cell: (float(mass[mask].sum()) / total if total > 0 else 0.0) for cell, mask in outcomes.cells.items()}
    return _Measures(advantages, positive, negative, mass, shares)


class _RunTotals:
    """The run's numbers, collected step by step in step order: each step's entry, and the sums and pools the
    run's summaries are made of."""

    def __init__(self, run: Run) -> None:
        names = [method.name for method in methods()]
        self.has_logged = all(step.logged_advantages is not None for step in run.steps)
        self.has_lags = all(step.policy_lag is not None for step in run.steps)
        self.steps: list[dict[str, Any]] = []
        self.groups_pooled: list[dict[str, Any]] = []
        self.pooled: dict[str, list[np.ndarray]] = {name: [] for name in names}
        self.mass_totals = {name: dict.fromkeys(CELLS, 0.0) for name in names}
        self.dead_count = self.group_count = self.dead_tokens = self.all_tokens = 0.0
        self.all_wrong = self.all_right = 0
        self.lengths_right: list[np.ndarray] = []
        self.lengths_wrong: list[np.ndarray] = []
        self.truncated_flags: list[np.ndarray] = []
        self.logged_gap = {name: 0.0 for name in names}
        self.lag_counts: dict[int, int] = {}
        self.lag_mass: dict[str, dict[int, float]] = {name: {} for name in names}

    def add(self, step: Step, outcomes: _Outcomes, measures: dict[str, _Measures]) -> None:
        entry = self._add_outcomes(step, outcomes)
        per_group: dict[str, Any] = {"p_hat": outcomes.p_hat, "size": outcomes.sizes}
        for name, measured in measures.items():
            per_group[name] = (measured.positive, measured.negative)
            entry["methods"][name] = {"max_abs_advantage": float(np.abs(measured.advantages).max()),
                                      **measured.shares}
            self._add_method(step, outcomes, name, measured)
        self.groups_pooled.append(per_group)
        self.steps.append(entry)

    def _add_outcomes(self, step: Step, outcomes: _Outcomes) -> dict[str, Any]:
        """The step's entry (its ``methods`` still empty), its dead groups, lengths and lags added to the run's."""
        dead, lengths, correct = outcomes.dead, outcomes.lengths, outcomes.correct
        dead_group_tokens = float(lengths[dead[outcomes.codes]].sum())
        right, wrong = length_by_outcome(lengths, correct)
        entry: dict[str, Any] = {
            "step": step.step, "responses": int(len(step.scores)), "groups": int(outcomes.n_groups),
            "success": float(outcomes.success.mean()), "dead_share": float(dead.mean()),
            "dead_token_share": dead_group_tokens / max(float(lengths.sum()), 1e-12),
            "length_correct": _finite(right), "length_incorrect": _finite(wrong),
            "truncated_share": None if step.truncated is None else float(step.truncated.mean()),
            "methods": {},
        }
        self.dead_count += float(dead.sum())
        self.group_count += outcomes.n_groups
        self.dead_tokens += dead_group_tokens
        self.all_tokens += float(lengths.sum())
        self.all_wrong += int((dead & (outcomes.p_hat == 0)).sum())
        self.all_right += int((dead & (outcomes.p_hat == 1)).sum())
        self.lengths_right.append(lengths[correct])
        self.lengths_wrong.append(lengths[~correct])
        if step.truncated is not None:
            self.truncated_flags.append(step.truncated)
        if self.has_lags:
            for lag, count in zip(*(values.tolist() for values in np.unique(step.policy_lag, return_counts=True))):
                self.lag_counts[lag] = self.lag_counts.get(lag, 0) + count
        return entry

    def _add_method(self, step: Step, outcomes: _Outcomes, name: str, measured: _Measures) -> None:
        """One method's update mass, |A| and distance to the logged advantages on the step, added to the run's."""
        for cell in CELLS:
            self.mass_totals[name][cell] += float(measured.mass[outcomes.cells[cell]].sum())
        if self.has_lags:
            # Summed over the step's distinct lags, not bincount(lags): an array as long as the largest lag would
            # be sized by the dump (dumps.py bounds a lag by its step, itself up to 2^53), not by its rows.
            lags, which = np.unique(step.policy_lag, return_inverse=True)
            by_lag = np.bincount(which.ravel(), weights=measured.mass, minlength=lags.size)
            lag_mass = self.lag_mass[name]
            for lag, mass in zip(lags.tolist(), by_lag.tolist()):
                lag_mass[lag] = lag_mass.get(lag, 0.0) + mass
        self.pooled[name].append(np.abs(measured.advantages))
        if self.has_logged:
            gap = np.abs(measured.advantages - step.logged_advantages)
            self.logged_gap[name] = max(self.logged_gap[name], float(gap.max()))

    def result(self, run: Run, settings: ApoSettings) -> dict[str, Any]:
        groups = max(self.group_count, 1)
        result = {
            "name": run.name, "folder": str(run.folder), "length_unit": run.length_unit,
            "apo_settings": dataclasses.asdict(settings),
            "steps": self.steps,
            "dead": {
                "share": self.dead_count / groups, "token_share": self.dead_tokens / max(self.all_tokens, 1e-12),
                "all_wrong_share": self.all_wrong / groups, "all_right_share": self.all_right / groups,
                "groups": int(self.group_count),
            },
            "difficulty": _difficulty(self.groups_pooled),
            "length": _length_summary(self.lengths_right, self.lengths_wrong, self.truncated_flags),
            "mass": {name: _normalized(cells) for name, cells in self.mass_totals.items()},
            "scale": {name: _scale(np.concatenate(values)) for name, values in self.pooled.items()},
        }
        if self.has_lags:
            responses = sum(self.lag_counts.values())
            result["staleness"] = {
                "response_share": {lag: count / responses for lag, count in sorted(self.lag_counts.items())},
                "mass": {name: _normalized(dict(sorted(by_lag.items()))) for name, by_lag in self.lag_mass.items()},
            }
        if self.has_logged:
            # Several methods match when no group had a signal (all advantages 0 under every method).
            result["logged"] = {"max_abs_difference": self.logged_gap,
                                "matches": [name for name, gap in self.logged_gap.items() if gap <= MATCH_TOLERANCE]}
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
                                   "closed_form": float(closed_form(p, int(size)))}
            for method in methods():
                positive = np.concatenate([g[method.name][0] for g in per_step])
                negative = np.concatenate([g[method.name][1] for g in per_step])
                row[method.name] = {"positive": float(positive[mask].mean()), "negative": float(negative[mask].mean())}
            rows.append(row)
    return rows
