"""From runs to ``summary.json``, ``report.md`` and the plots.

Every comparison is paired: a method's number minus another's on the same seed (same initial weights, same
prompts). A difference counts as more than seed noise only when every seed agrees on its sign and a paired
t-test clears the two-sided 5% level; the report says "within seed noise" otherwise.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from recipe_apo.methods.checks import OWN_AGGREGATION
from recipe_apo.testbed.settings import PAIRED_METRICS
from recipe_apo.testbed.train import BUCKETS


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


# (key, header, format, higher is better?) of the main table, in order; after them each method's metrics
# (``method_rows``).
HEADLINE = [
    ("success_avg", "success, mean over training", "{:.3f}", True),
    ("success_early", "success, early", "{:.3f}", True),
    ("success_final", "success, final", "{:.3f}", True),
    ("hard_success_avg", "hardest third, mean over training", "{:.3f}", True),
    ("hard_success_final", "hardest third, final", "{:.3f}", True),
    ("easy_success_avg", "easiest third, mean over training", "{:.3f}", True),
    ("fillers_correct", "fillers in correct (last quarter)", "{:.2f}", None),
    ("fillers_incorrect", "fillers in incorrect (last quarter)", "{:.2f}", None),
    ("len_correct", "length of correct, raw (last quarter)", "{:.1f}", None),
    ("len_incorrect", "length of incorrect, raw (last quarter)", "{:.1f}", None),
    ("cut_share", "share cut at L0 (last quarter)", "{:.3f}", False),
    ("live_share_avg", "share of responses in groups with a signal", "{:.2f}", None),
    ("ratio_dev_mean", "ratio at the update's start, mean abs(r - 1) (stale runs)", "{:.3f}", None),
    ("ratio_out_share_avg", "share of tokens with r outside [0.8, 1.2]", "{:.3f}", None),
    ("clipfrac_avg", "share of tokens clipped (pg_clipfrac; PPO-clip losses, at their own clip)", "{:.3f}", None),
    ("kl_loss_avg", "KL loss to the initial policy (use_kl_loss)", "{:.4f}", None),
    ("grad_norm_mean", "grad norm before clip, mean", "{:.3f}", None),
    ("grad_norm_max", "grad norm before clip, max", "{:.3f}", None),
    ("tokens_generated_avg", "tokens generated per round (training responses + any probe)", "{:.0f}", None),
    ("probe_tokens_avg", "of which a method's probe (scored, then dropped)", "{:.0f}", None),
    ("filter_groups/gen_batches_avg", "group filter: generation batches per round", "{:.2f}", None),
    ("filter_groups/filled_share_avg", "group filter: share of the batch filled with groups with a signal", "{:.2f}",
     None),
    ("wall_s", "wall time per run (s)", "{:.1f}", None),
]


def method_rows() -> list[tuple[str, str, str, None]]:
    """A row per metric a method declares (``<method>/<quantity>``, and its losses' ``actor/<method>_...``; its
    declaration's words): its mean over the rounds."""
    from recipe_apo.methods import catalog

    return [(f"{name}_avg", f"{name}: {declared.words}, mean over rounds", "{:.3f}", None)
            for name, declared in catalog.metrics().items()]


# The metrics compared pair by pair.
PAIRED = list(PAIRED_METRICS)  # settings.PAIRED_METRICS: league.metric is one of them


def _nanmean(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def _nanstd(values) -> float:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(values.std(ddof=1)) if values.size > 1 else float("nan")


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
    out["fillers_correct"] = _nanmean(history["fillers_correct"][last])
    out["fillers_incorrect"] = _nanmean(history["fillers_incorrect"][last])
    out["len_correct"] = _nanmean(history["len_correct"][last])
    out["len_incorrect"] = _nanmean(history["len_incorrect"][last])
    out["len_correct_first"] = _nanmean(history["len_correct"][: max(1, rounds // 10)])
    out["len_incorrect_first"] = _nanmean(history["len_incorrect"][: max(1, rounds // 10)])
    out["cut_share"] = _nanmean(history["cut_share"][last])
    out["cut_share_avg"] = _nanmean(history["cut_share"])
    out["grad_norm_mean"] = _nanmean(history["grad_norm"])
    out["grad_norm_max"] = float(np.nanmax(history["grad_norm_max"]))
    out["batch_success_avg"] = _nanmean(history["batch_success"])
    if "live_share" in history:
        out["live_share_avg"] = _nanmean(history["live_share"])
    # The trust region at work: tokens whose ratio left [0.8, 1.2] (measured alike for every loss).
    if "ratio_out_share" in history:
        out["ratio_out_share_avg"] = _nanmean(history["ratio_out_share"])
    if "ratio_dev_mean" in history:
        out["ratio_dev_mean"] = _nanmean(history["ratio_dev_mean"])
    if "actor/pg_clipfrac" in history:
        out["clipfrac_avg"] = _nanmean(history["actor/pg_clipfrac"])
    # Generation per round: the training responses' tokens and any probe's.
    if "tokens_generated" in history:
        out["tokens_generated_avg"] = _nanmean(history["tokens_generated"])
        if any(np.asarray(history["probe_tokens"]) > 0):
            out["probe_tokens_avg"] = _nanmean(history["probe_tokens"])
    # verl's group filter: generation batches per round, and the share of the batch it filled with groups with a
    # signal.
    for key in ("filter_groups/gen_batches", "filter_groups/filled_share"):
        if key in history:
            out[f"{key}_avg"] = _nanmean(history[key])
    if "actor/kl_loss" in history:
        out["kl_loss_avg"] = _nanmean(history["actor/kl_loss"])
    # Each method's metrics (``<method>/<quantity>``, and what its losses log): the mean over the rounds where it
    # has a value, the last value, the largest.
    for key in method_keys(history):
        out[f"{key}_avg"] = _nanmean(history[key])
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
    once per pair; which label comes first says the sign, not a name prefix: "apo" is a prefix of "apo_clip")."""
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
                "mean": _nanmean([per_run[label][str(s)][key] for s in seeds]),
                "std": _nanstd([per_run[label][str(s)][key] for s in seeds]),
            }
            for key in keys
        }
    comparisons = {}
    for i, a in enumerate(labels):
        for b in labels[:i]:
            # Later methods first: with the default order this reads "apo - grpo", "drgrpo - grpo", ...
            comparisons[f"{a} - {b}"] = {
                key: paired([per_run[a][str(s)][key] for s in seeds], [per_run[b][str(s)][key] for s in seeds])
                for key in metrics
            }
    return aggregate, comparisons


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


def _fmt(fmt: str, value: float) -> str:
    return "nan" if value is None or not math.isfinite(value) else fmt.format(value)


def mean_and_spread(fmt: str, mean: float, std: float, mean_fmt: str | None = None) -> str:
    """``mean +- std``; the mean alone where there is no spread to give (one seed: the std is NaN).
    ``mean_fmt``: the mean's own format (e.g. signed for a difference), default ``fmt``."""
    mean_fmt = mean_fmt or fmt
    if mean is None or not math.isfinite(mean):
        return "nan"
    if std is None or not math.isfinite(std):
        return f"{mean_fmt.format(mean)} (one seed)"
    return f"{mean_fmt.format(mean)} +- {fmt.format(std)}"


def task_text(cfg: dict[str, Any]) -> str:
    """The task of a summary's config in words ("strings of up to 8 symbols")."""
    from omegaconf import OmegaConf

    from recipe_apo.testbed.train import make_task

    return make_task(OmegaConf.create(cfg)).describe()


def report_markdown(summary: dict[str, Any]) -> str:
    """report.md: the setting and the methods, the initial policy, the means, the paired differences, the
    verdict."""
    lines = (_setting(summary) + _initial_policy(summary) + _means_table(summary) + _paired_table(summary)
             + ["", "## Verdict", ""] + verdict_lines(summary))
    lines += ["", "Plots: `success.png`, `length.png`, `anchor.png`, `grad_norm.png`.", ""]
    return "\n".join(lines)


def _setting(summary: dict[str, Any]) -> list[str]:
    """The title, the task and sizes, the kernels, and one table row per method."""
    labels = list(summary["methods"])
    cfg = summary["config"]
    stale = f", responses from the policy of {cfg['staleness']} rounds before" if cfg.get("staleness") else ""
    lines = [
        f"# CPU testbed: {', '.join(labels)} ({len(summary['seeds'])} seeds, scenario `{summary['scenario']}`, "
        f"task `{cfg['task'].get('name', 'reverse')}`)",
        "",
        f"Task: {task_text(cfg)}{stale}. {cfg['rounds']} rounds of {cfg['data']['train_batch_size']} prompts x "
        f"G={cfg['actor_rollout_ref']['rollout']['n']} responses, L0={cfg['data']['max_response_length']}, "
        f"ppo_epochs={cfg['actor_rollout_ref']['actor']['ppo_epochs']}, "
        f"mini-batch {cfg['actor_rollout_ref']['actor']['ppo_mini_batch_size']} prompts. Success = share of sampled "
        f"responses (temperature 1) that are correct on a fixed evaluation set; buckets are thirds of that set by "
        f"the initial policy's own success rate. Wall time of the whole run: {summary['wall_s']:.0f} s.",
        *_kernels_line(summary),
        "",
        "| method | estimator | std norm | loss | aggregation | zero-variance groups in the denominator | G |",
        "|---|---|---|---|---|---|---|",
    ]
    return lines + [_method_row(label, m) for label, m in summary["methods"].items()]


ZERO_VARIANCE_WORDS = {"keep": "kept", "exclude": "excluded (round-level scale)", "exact": "excluded (per mini-batch)"}


def _method_row(label: str, m: dict[str, Any]) -> str:
    """A method's row of the report's first table: its estimator, loss and denominator settings."""
    from recipe_apo.methods import catalog

    # The estimators that read norm_adv_by_std_in_grpo: verl's grpo, and the methods' that declare it.
    std = m["norm_adv_by_std_in_grpo"] if m["adv_estimator"] in ("grpo", *catalog.std_norm_estimators()) else "-"
    agg = m["loss_agg_mode"] + (f" / {m['loss_scale_factor']}" if m["loss_agg_mode"].endswith("norm") else "")
    if m["loss_mode"] in OWN_AGGREGATION:  # the loss ignores loss_agg_mode: show what it does
        agg = f"{OWN_AGGREGATION[m['loss_mode']]} (the loss's own; {m['loss_agg_mode']} ignored)"
    zv = ZERO_VARIANCE_WORDS.get(m.get("zero_variance", "keep"), m.get("zero_variance"))
    group = m.get("rollout_n", "-")
    return f"| {label} | `{m['adv_estimator']}` | {std} | `{m['loss_mode']}` | `{agg}` | {zv} | {group} |"


def _initial_policy(summary: dict[str, Any]) -> list[str]:
    init = summary["seed_setup"]
    return [
        "",
        "Initial policy (shared by all methods of a seed), measured on fresh samples: success "
        + ", ".join(
            f"seed {s}: {init[str(s)]['initial_success']:.2f} "
            f"(hard {init[str(s)]['initial_success_by_bucket']['hard']:.2f}, "
            f"easy {init[str(s)]['initial_success_by_bucket']['easy']:.2f})"
            for s in summary["seeds"]
        )
        + ".",
    ]


def _means_table(summary: dict[str, Any]) -> list[str]:
    labels = list(summary["methods"])
    lines = [
        "",
        "## Mean +- std over seeds",
        "",
        "| metric | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    agg = summary["aggregate"]
    for key, header, fmt, _ in HEADLINE + method_rows():
        if not any(key in agg[name] for name in labels):  # no method of the run has it
            continue
        # A method-specific key (the soft gate's weight) is "-" for the methods without it.
        cells = [mean_and_spread(fmt, agg[name][key]["mean"], agg[name][key]["std"]) if key in agg[name] else "-"
                 for name in labels]
        lines.append(f"| {header} | " + " | ".join(cells) + " |")
    return lines


def _paired_table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Paired differences (same seed, same start, same prompts)",
        "",
        "Per-seed differences `a - b`; *agree* counts the seeds on the majority side. **Bold**: every seed agrees "
        "and a paired t-test clears 5%; otherwise the difference is within seed noise.",
        "",
        "| comparison | metric | per seed | mean +- std | agree | verdict |",
        "|---|---|---|---|---|---|",
    ]
    headers = {key: header for key, header, _, _ in HEADLINE + method_rows()}
    formats = {key: fmt for key, _, fmt, _ in HEADLINE + method_rows()}
    for name, metrics in summary["paired"].items():
        for key, p in metrics.items():
            fmt = formats[key]
            per_seed = " ".join(_fmt(fmt.replace("{:", "{:+"), x) for x in p["per_seed"])
            mean = mean_and_spread(fmt, p["mean"], p["std"], mean_fmt=fmt.replace("{:", "{:+"))
            verdict = f"**{p['direction']}**" if p["beyond_seed_noise"] else "within seed noise"
            agree = f"{p['seeds_agree']}/{p['seeds']}"
            lines.append(f"| {name} | {headers[key]} | {per_seed} | {mean} | {agree} | {verdict} |")
    return lines


def verdict_lines(summary: dict[str, Any]) -> list[str]:
    """Plain sentences on APO against each baseline, for the headline metrics."""
    out = []
    labels = list(summary["methods"])
    apo = [name for name in labels if summary["methods"][name]["adv_estimator"] == "apo"]
    for a in apo:
        for b in labels:
            if b == a:
                continue
            for metric, words in [("success_avg", "mean success over training"),
                                  ("hard_success_avg", "mean success on the hardest third")]:
                p = paired_between(summary, a, b, metric)
                d = p["mean"]
                missing = f", {p['seeds_missing']} seed(s) without a value" if p.get("seeds_missing") else ""
                if p["beyond_seed_noise"]:
                    how = "beats" if d > 0 else "trails"
                    out.append(f"- {a} {how} {b} on {words} by {abs(d):.3f} "
                               f"({p['seeds_agree']}/{p['seeds']} seeds agree).")
                else:
                    out.append(f"- {a} vs {b}, {words}: {d:+.3f}, within seed noise "
                               f"({p['seeds_agree']}/{p['seeds']} seeds on one side{missing}).")
    return out or ["- no APO method in this run."]


def _kernels_line(summary: dict[str, Any]) -> list[str]:
    """What ran (recipe_apo/testbed/kernels.py), as one line of the report; none for an older summary."""
    kernels = summary.get("kernels")
    if not kernels:
        return []
    pinned = kernels.get("pinned")
    how = "pinned (" + ", ".join(f"{k}={v}" for k, v in pinned.items()) + ")" if pinned else "native"
    return [f"Kernels: torch {kernels['torch']}, CPU capability {kernels['cpu_capability']}, {how}, "
            f"{kernels['workers']} worker(s) x {kernels['threads']} thread(s)."]


# Every file write_outputs writes (the league removes a scenario's run by this list: league.clear_earlier_league).
RUN_FILES = ("summary.json", "history.json", "report.md", "success.png", "length.png", "anchor.png", "grad_norm.png")


def write_outputs(summary: dict[str, Any], runs: list[dict[str, Any]], out_dir: Path, plots: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True))
    (out_dir / "history.json").write_text(json.dumps(runs, allow_nan=True))
    (out_dir / "report.md").write_text(report_markdown(summary))
    if plots:
        from recipe_apo.testbed.plots import plot_runs

        plot_runs(summary, runs, out_dir)
