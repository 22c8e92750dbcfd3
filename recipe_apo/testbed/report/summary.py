"""From a run's rounds to ``summary.json`` and the run's files (``write_outputs``): per run, the means over the
rounds; per method, their mean and std over seeds; per pair of methods, the paired differences (``stats``).

The adapter (``recipe_apo.testbed.train``) records each round's history; everything here reads it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from recipe_apo.testbed.report.markdown import report_markdown
from recipe_apo.testbed.report.plots import PLOTS
from recipe_apo.testbed.report.stats import compare_runs, nanmean
from recipe_apo.testbed.train import BUCKETS


def run_summary(run: dict[str, Any], rounds: int, early_fraction: float) -> dict[str, float]:
    """The per-run numbers of summary.json."""
    evals, history = run["evals"], run["history"]
    eval_rounds = np.asarray(evals["round"])
    trained = eval_rounds > 0  # round 0 is the shared start, identical for every method of a seed
    early = trained & (eval_rounds <= max(1, math.ceil(early_fraction * rounds)))
    if not early.any():
        early = trained & (eval_rounds == eval_rounds[trained].min())
    out: dict[str, float] = {}
    for name, prefix in [("overall", "success")] + [(b, f"{b}_success") for b in BUCKETS]:
        series = np.asarray(evals[name])
        out[f"{prefix}_initial"] = float(series[0])
        out[f"{prefix}_early"] = float(series[early].mean())
        out[f"{prefix}_avg"] = float(series[trained].mean())
        out[f"{prefix}_final"] = float(series[-1])
    last = slice(-max(1, rounds // 4), None)
    out["fillers_correct"] = nanmean(history["fillers_correct"][last])
    out["fillers_incorrect"] = nanmean(history["fillers_incorrect"][last])
    out["len_correct"] = nanmean(history["len_correct"][last])
    out["len_incorrect"] = nanmean(history["len_incorrect"][last])
    out["len_correct_first"] = nanmean(history["len_correct"][: max(1, rounds // 10)])
    out["len_incorrect_first"] = nanmean(history["len_incorrect"][: max(1, rounds // 10)])
    out["cut_share"] = nanmean(history["cut_share"][last])
    out["cut_share_avg"] = nanmean(history["cut_share"])
    out["grad_norm_mean"] = nanmean(history["grad_norm"])
    out["grad_norm_max"] = float(np.nanmax(history["grad_norm_max"]))
    out["batch_success_avg"] = nanmean(history["batch_success"])
    if "live_share" in history:
        out["live_share_avg"] = nanmean(history["live_share"])
    # The trust region at work: tokens whose ratio left [0.8, 1.2] (measured alike for every loss).
    if "ratio_out_share" in history:
        out["ratio_out_share_avg"] = nanmean(history["ratio_out_share"])
    if "ratio_dev_mean" in history:
        out["ratio_dev_mean"] = nanmean(history["ratio_dev_mean"])
    if "actor/pg_clipfrac" in history:
        out["clipfrac_avg"] = nanmean(history["actor/pg_clipfrac"])
    # Generation per round: the training responses' tokens and any probe's.
    if "tokens_generated" in history:
        out["tokens_generated_avg"] = nanmean(history["tokens_generated"])
        if any(np.asarray(history["probe_tokens"]) > 0):
            out["probe_tokens_avg"] = nanmean(history["probe_tokens"])
    # verl's group filter: generation batches per round, and the share of the batch it filled with groups with a
    # signal.
    for key in ("filter_groups/gen_batches", "filter_groups/filled_share"):
        if key in history:
            out[f"{key}_avg"] = nanmean(history[key])
    if "actor/kl_loss" in history:
        out["kl_loss_avg"] = nanmean(history["actor/kl_loss"])
    # Each method's metrics (``<method>/<quantity>``, and what its losses log): the mean over the rounds where it
    # has a value, the last value, the largest.
    for key in method_keys(history):
        out[f"{key}_avg"] = nanmean(history[key])
        out[f"{key}_final"] = float(history[key][-1])
        finite = np.asarray(history[key], dtype=np.float64)
        out[f"{key}_max"] = float(finite[np.isfinite(finite)].max()) if np.isfinite(finite).any() else float("nan")
    out["wall_s"] = float(run["wall_s"])
    return out


def active_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """method name -> its settings (``algorithm.<settings_key>``, None for a method without) of the recipe's methods
    a run's config activates."""
    from omegaconf import OmegaConf

    from recipe_apo.methods import catalog

    node = OmegaConf.create(cfg)
    return {m.name: (cfg["algorithm"].get(m.settings_key) if m.settings_key else None)
            for m in catalog.active(node)}


def method_keys(history: dict[str, Any]) -> list[str]:
    """The history's method metrics (``<method>/<quantity>`` of a method of the catalog, or a metric a method's loss
    declares) with a value in some round."""
    from recipe_apo.methods import catalog

    names, declared = set(catalog.names()), set(catalog.metrics())
    return [key for key in history if (key.partition("/")[0] in names or key in declared)
            and np.isfinite(np.asarray(history[key], dtype=np.float64)).any()]



def _initial_success(seed: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The initial policy's success, overall and by bucket, from the round-0 evaluation: fresh samples, not the
    ones that sorted prompts into buckets (those make "hard" look harder than it is). Every method of a seed
    evaluates the same start with the same samples, so any run of the seed gives it."""
    run = next(r for r in runs if r["seed"] == seed)
    evals = run["evals"]
    if not evals["round"] or evals["round"][0] != 0:
        raise ValueError(f"seed {seed}: the run has no evaluation at round 0")
    return {"initial_success": float(evals["overall"][0]),
            "initial_success_by_bucket": {name: float(evals[name][0]) for name in BUCKETS}}



def build_summary(
    cfg_by_label: dict[str, Any], setups: dict, runs: list[dict[str, Any]], wall_s: float, base_cfg: dict
) -> dict[str, Any]:
    labels = list(cfg_by_label)
    seeds = sorted(setups)
    per_run: dict[str, dict[str, dict[str, float]]] = {label: {} for label in labels}
    for run in runs:
        cfg = cfg_by_label[run["label"]]
        per_run[run["label"]][str(run["seed"])] = run_summary(run, cfg["rounds"], cfg["early_fraction"])
    aggregate, comparisons = compare_runs(per_run, labels, seeds)
    methods = {
        label: {
            "adv_estimator": cfg["algorithm"]["adv_estimator"],
            "norm_adv_by_std_in_grpo": cfg["algorithm"].get("norm_adv_by_std_in_grpo"),
            "loss_mode": cfg["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"],
            "loss_agg_mode": cfg["actor_rollout_ref"]["actor"]["loss_agg_mode"],
            "loss_scale_factor": cfg["actor_rollout_ref"]["actor"].get("loss_scale_factor"),
            # The one method setting held here by name (readers of summary.json read it); "active" says the rest.
            "zero_variance": cfg["algorithm"].get("zero_variance", "keep"),
            "rollout_n": cfg["actor_rollout_ref"]["rollout"]["n"] * cfg.get("rollout_n_multiplier", 1),
            # The recipe's methods the run activates, each with its settings node (``algorithm.<key>``).
            "active": active_settings(cfg),
        }
        for label, cfg in cfg_by_label.items()
    }
    return {
        "scenario": base_cfg.get("scenario_name"),
        "seeds": seeds,
        "methods": methods,
        "seed_setup": {
            str(s): {
                "init_weights_sha256": setups[s].init_digest,
                "pretrain_loss": setups[s].pretrain_loss,
                **_initial_success(s, runs),
                # The samples that defined the buckets: biased toward the extremes within each bucket.
                "bucketing_success_by_bucket": {
                    name: float(setups[s].initial_success[setups[s].bucket == b].mean())
                    for b, name in enumerate(BUCKETS)
                },
            }
            for s in seeds
        },
        "runs": per_run,
        "aggregate": aggregate,
        "paired": comparisons,
        "wall_s": wall_s,
        "config": base_cfg,
    }


# Every file write_outputs writes (the league removes a scenario's run by this list: league.clear_earlier_league).
RUN_FILES = ("summary.json", "history.json", "report.md", *(f"{name}.png" for name in PLOTS))


def write_outputs(summary: dict[str, Any], runs: list[dict[str, Any]], out_dir: Path, plots: bool = True) -> None:
    """A run's files: summary.json, history.json (every run's rounds, as the adapter recorded them), report.md and
    the plots."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True))
    (out_dir / "history.json").write_text(json.dumps(runs, allow_nan=True))
    (out_dir / "report.md").write_text(report_markdown(summary))
    if plots:
        from recipe_apo.testbed.report.plots import plot_runs  # matplotlib, only when plotting

        plot_runs(summary, runs, out_dir)
