"""PNG plots of a testbed run (mean over seeds as a line, the seeds' spread, min to max, as a band; the methods'
own series one line per seed) and of a league."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a server or in CI
    import matplotlib.pyplot as plt

    return plt


def _series(runs, label, getter):
    rows = [getter(r) for r in runs if r["label"] == label]
    width = min(len(r) for r in rows)
    return np.asarray([r[:width] for r in rows], dtype=np.float64)


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or values.shape[-1] < window:
        return values
    kernel = np.ones(window) / window
    # NaNs (a round without correct responses) are filled from their neighbours before smoothing.
    out = []
    for row in np.atleast_2d(values):
        idx = np.arange(len(row))
        good = np.isfinite(row)
        row = np.interp(idx, idx[good], row[good]) if good.any() else row
        out.append(np.convolve(np.pad(row, (window // 2, window - 1 - window // 2), mode="edge"), kernel, "valid"))
    return np.asarray(out)


def _band(ax, x, values, label, color, style="-"):
    mean = np.nanmean(values, axis=0)
    ax.plot(x, mean, style, color=color, label=label)
    ax.fill_between(x, np.nanmin(values, axis=0), np.nanmax(values, axis=0), color=color, alpha=0.15, lw=0)


# A run's plots, each written to <name>.png (summary.RUN_FILES lists them).
PLOTS = ("success", "length", "metrics", "grad_norm")


def plot_runs(summary: dict[str, Any], runs: list[dict[str, Any]], out_dir: Path) -> None:
    """``PLOTS`` of a run."""
    import warnings

    labels = list(summary["methods"])
    look = {
        "labels": labels,
        "colors": {label: f"C{i}" for i, label in enumerate(labels)},
        "window": max(1, summary["config"]["rounds"] // 25),
        "note": f"line: mean of {len(summary['seeds'])} seeds; band: min-max over seeds",
    }
    # Rounds without a correct response leave NaN lengths; an all-NaN column is a gap in the plot, not news.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        plt = _pyplot()
        figures = {"success": _plot_success, "length": _plot_length, "metrics": _plot_metrics,
                   "grad_norm": _plot_grad_norm}
        for name in PLOTS:
            plot = figures[name]
            fig = plot(plt, summary, runs, look)
            fig.tight_layout()
            fig.savefig(out_dir / f"{name}.png", dpi=110)
            plt.close(fig)


def _plot_success(plt, summary: dict[str, Any], runs: list[dict[str, Any]], look: dict[str, Any]):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for label in look["labels"]:
        x = runs[[r["label"] for r in runs].index(label)]["evals"]["round"]
        _band(axes[0], x, _series(runs, label, lambda r: r["evals"]["overall"]), label, look["colors"][label])
        _band(axes[1], x, _series(runs, label, lambda r: r["evals"]["hard"]), label, look["colors"][label])
    axes[0].set_title("success on the evaluation set")
    axes[1].set_title("success on its hardest third (by the initial policy)")
    for ax in axes:
        ax.set_xlabel("round")
        ax.set_ylabel("share of correct sampled responses")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(look["note"], fontsize=9)
    return fig


def _plot_length(plt, summary: dict[str, Any], runs: list[dict[str, Any]], look: dict[str, Any]):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(1, summary["config"]["rounds"] + 1)
    for label in look["labels"]:
        for ax, key in zip(axes, ("len_correct", "len_incorrect")):
            values = _smooth(_series(runs, label, lambda r: r["history"][key]), look["window"])
            _band(ax, x[: values.shape[1]], values, label, look["colors"][label])
    L0 = summary["config"]["data"]["max_response_length"]
    for ax, title in zip(axes, ("correct responses", "incorrect responses")):
        ax.axhline(L0, color="grey", ls=":", lw=1)
        ax.set_title(f"mean length of {title} (tokens; dotted: L0={L0})")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{look['note']}; moving average over {look['window']} rounds", fontsize=9)
    return fig


def _plot_metrics(plt, summary: dict[str, Any], runs: list[dict[str, Any]], look: dict[str, Any]):
    """A panel per headline metric a method declares (``Metric.headline``) that some run logged, titled by its
    declared words; one line per seed, coloured by label."""
    from recipe_apo.methods import catalog

    declared = catalog.metrics()

    def logged(run: dict[str, Any], name: str) -> bool:
        values = np.asarray(run["history"].get(name, []), dtype=np.float64)
        return bool(np.isfinite(values).any())

    names = [name for name in catalog.headline_metrics() if any(logged(r, name) for r in runs)]
    if not names:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        ax.set_title("no method of this run logs a headline metric")
        ax.axis("off")
        return fig
    columns = min(3, len(names))
    fig, axes = plt.subplots(math.ceil(len(names) / columns), columns, figsize=(4.4 * columns,
                             3.4 * math.ceil(len(names) / columns)), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for label in look["labels"]:
            rows = [r for r in runs if r["label"] == label and logged(r, name)]
            for i, r in enumerate(rows):
                values = np.asarray(r["history"][name], dtype=np.float64)
                ax.plot(np.arange(1, len(values) + 1), values, color=look["colors"][label], lw=1.0,
                        label=label if i == 0 else None)
        ax.set_title(textwrap.fill(f"{name}: {declared[name].words}", 48), fontsize=8)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle("the methods' headline metrics (as they declare them), one line per seed", fontsize=9)
    return fig


def _plot_grad_norm(plt, summary: dict[str, Any], runs: list[dict[str, Any]], look: dict[str, Any]):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label in look["labels"]:
        values = _smooth(_series(runs, label, lambda r: r["history"]["grad_norm"]), look["window"])
        _band(ax, np.arange(1, values.shape[1] + 1), values, label, look["colors"][label])
    clip = summary["config"]["actor_rollout_ref"]["actor"]["grad_clip"]
    ax.axhline(clip, color="grey", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_title(f"gradient norm before clipping (dotted: grad_clip={clip})")
    ax.set_xlabel("round")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle(f"{look['note']}; moving average over {look['window']} rounds", fontsize=9)
    return fig


def plot_league(league: dict[str, Any], path: Path) -> None:
    """Per scenario, each method's paired difference to the first method on the league's metric: mean over
    seeds with its standard error, the seeds as small dots; filled when beyond seed noise."""
    plt = _pyplot()
    labels = league["labels"]
    reference = labels[0]
    scenarios = league["scenarios"]
    metric = league["metric"]
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 0.45 * len(labels) + 1.8),
                             sharey=True, squeeze=False)
    y = np.arange(len(labels))[::-1]
    # One colour per league method, its variants in the same colour with a square marker.
    families = league.get("families") or {label: label for label in labels}
    family_color = {f: f"C{i}" for i, f in enumerate(dict.fromkeys(families[label] for label in labels))}
    for ax, (name, s) in zip(axes[0], scenarios.items()):
        ref = next(r for r in s["rows"] if r["method"] == reference)[metric]["mean"]
        ax.axvline(0.0, color="grey", lw=1)
        for yi, label in zip(y, labels):
            color = family_color[families[label]]
            marker = "o" if families[label] == label else "s"
            if label == reference:
                ax.plot([0.0], [yi], "D", color=color, ms=6)
                continue
            p = s["matrix"][label][reference]
            per_seed = np.asarray(p["per_seed"], dtype=np.float64)
            ax.plot(per_seed, np.full(per_seed.shape, yi + 0.18), ".", color="grey", ms=3, alpha=0.7)
            se = p["std"] / np.sqrt(p["seeds"]) if p["seeds"] > 1 and np.isfinite(p["std"]) else 0.0
            ax.errorbar([p["mean"]], [yi], xerr=[se], fmt=marker, color=color, capsize=3,
                        mfc=color if p["beyond_seed_noise"] else "white", ms=7)
        rank = {r["method"]: r["rank"] for r in s["rows"]}
        for yi, label in zip(y, labels):  # the rank, at the panel's right edge
            ax.text(1.0, yi, f" #{rank[label]}", transform=ax.get_yaxis_transform(), va="center", fontsize=8)
        ax.set_title(f"{name} ({reference}: {ref:.3f})", fontsize=10)
        ax.set_xlabel(f"{metric} minus {reference}'s, same seed")
        ax.grid(alpha=0.3)
    axes[0][0].set_yticks(y)
    axes[0][0].set_yticklabels(labels)
    fig.suptitle(f"paired difference to {reference}: mean +- SE over {len(next(iter(scenarios.values()))['seeds'])} "
                 "seeds (grey: each seed); filled = beyond seed noise, hollow = within; square: a variant; "
                 "#rank in the scenario", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
