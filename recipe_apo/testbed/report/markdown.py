"""``report.md``: the setting and the methods, the initial policy, the means over seeds, the paired differences and
the verdict sentences. Every row of a method's own comes from its declaration (``recipe_apo.methods.base.Metric``:
its words); a metric a method does not log shows ``-``.
"""

from __future__ import annotations

import math
from typing import Any

from recipe_apo.methods.checks import OWN_AGGREGATION
from recipe_apo.testbed.report.plots import PLOTS
from recipe_apo.testbed.report.stats import paired_between

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
    ("probe_tokens_avg", "of which a runtime's probe (Host.probe: scored, then dropped)", "{:.0f}", None),
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
    lines += ["", "Plots: " + ", ".join(f"`{name}.png`" for name in PLOTS) + ".", ""]
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
        "| method | estimator | std norm | loss | aggregation | the recipe's methods on | G |",
        "|---|---|---|---|---|---|---|",
    ]
    return lines + [_method_row(label, m) for label, m in summary["methods"].items()]


def _method_row(label: str, m: dict[str, Any]) -> str:
    """A method's row of the report's first table: its estimator, loss and aggregation, and the recipe's methods
    its config activates (their titles)."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    from recipe_apo.methods import catalog

    # The estimators that read norm_adv_by_std_in_grpo: verl's own that verl hands it to, and the methods' that
    # declare it (``Estimator.reads_std_norm``).
    readers = (AdvantageEstimator.GRPO.value, *catalog.std_norm_estimators())
    std = m["norm_adv_by_std_in_grpo"] if m["adv_estimator"] in readers else "-"
    agg = m["loss_agg_mode"] + (f" / {m['loss_scale_factor']}" if m["loss_agg_mode"].endswith("norm") else "")
    if m["loss_mode"] in OWN_AGGREGATION:  # the loss ignores loss_agg_mode: show what it does
        agg = f"{OWN_AGGREGATION[m['loss_mode']]} (the loss's own; {m['loss_agg_mode']} ignored)"
    titles = {known.name: known.title for known in catalog.methods()}
    on = ", ".join(titles.get(name, name) for name in m.get("active") or {}) or "-"
    group = m.get("rollout_n", "-")
    return f"| {label} | `{m['adv_estimator']}` | {std} | `{m['loss_mode']}` | `{agg}` | {on} | {group} |"


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
        # A key that some methods log only (a method's own metric) is "-" for the others.
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
    """Plain sentences on each run of a featured method (``Method.featured``: a label whose estimator is one of its)
    against every other label, for the headline metrics."""
    from recipe_apo.methods import catalog

    out = []
    labels = list(summary["methods"])
    featured = catalog.featured()
    estimators = {name for m in featured for name in m.estimators}
    for a in [name for name in labels if summary["methods"][name]["adv_estimator"] in estimators]:
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
    return out or [f"- no {' or '.join(m.title for m in featured) or 'featured'} method in this run."]


def _kernels_line(summary: dict[str, Any]) -> list[str]:
    """What ran (recipe_apo/testbed/kernels.py), as one line of the report; none for an older summary."""
    kernels = summary.get("kernels")
    if not kernels:
        return []
    pinned = kernels.get("pinned")
    how = "pinned (" + ", ".join(f"{k}={v}" for k, v in pinned.items()) + ")" if pinned else "native"
    cpu = f", on {kernels['cpu']}" if kernels.get("cpu") else ""
    return [f"Kernels: torch {kernels['torch']}, CPU capability {kernels['cpu_capability']}, {how}, "
            f"{kernels['workers']} worker(s) x {kernels['threads']} thread(s){cpu}."]
