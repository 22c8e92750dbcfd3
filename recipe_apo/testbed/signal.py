"""``mode=signal``: Proposition 1 of the APO paper, measured.

For binary rewards with success probability p, sample groups of G rewards, push them through verl's
``compute_advantage`` with each method's registered estimator, and average the group's *positive signal*

    S = sum over the group's responses of max(A_i, 0),

where A_i is exactly what the estimator hands to the loss: GRPO (``grpo``, std-normalized)
(R_i - mean) / (std + eps); Dr. GRPO (``grpo`` without std) R_i - mean; APO (``apo``) Phi_i (R_i - mean),
lambda_scale included, against an anchor C_t held still at ``signal.anchor``. For Dr. GRPO, E[S] has the closed
form p (1 - p) (G - 1) (the paper's Proposition 1: it vanishes like O(p) on hard prompts). The exact E[S] of
every method comes from summing the estimator's output for each K = 0..G successes under Bin(G, p).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from recipe_apo.integration import replay
from recipe_apo.methods import group_stats
from recipe_apo.methods.apo.anchor import reset_driver_anchors
from recipe_apo.methods.group_stats import closed_form

# The methods compared, by name: the presets a replay from scores can run (recipe_apo.integration.replay, shared
# with the bias audit, so S means the same in both reports).
METHODS = tuple(method.name for method in replay.methods())


def positive_signal(rewards: torch.Tensor, method: str, apo_node: dict, anchor: float) -> torch.Tensor:
    """S per group for rewards [groups, G], through verl's compute_advantage."""
    groups, size = rewards.shape
    # eta = eta_min = 0 hold the anchor at anchor_init, so every group is judged against the same C_t.
    apo = {**dict(apo_node), "anchor_init": anchor, "eta": 0.0, "eta_min": 0.0}
    codes = np.repeat(np.arange(groups), size)
    reset_driver_anchors()
    try:
        # Rewards drawn without responses: one token each, so AGPO's length bonus has no spread to act on.
        advantages = replay.method_advantages(rewards.reshape(-1).numpy(), codes, replay.method_named(method), apo,
                                              lengths=np.ones(codes.size))
    finally:
        reset_driver_anchors()
    positive, _ = group_stats.signal_per_group(advantages, codes, groups)
    return torch.from_numpy(positive)


def measure(group_sizes, p_points: int, groups: int, anchor: float, apo_node: dict, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    p = np.linspace(0.0, 1.0, p_points)
    out: dict[str, Any] = {"p": p.tolist(), "anchor": anchor, "groups": groups, "by_G": {}}
    for size in group_sizes:
        # All p values in one batch per method: one compute_advantage call instead of one per point.
        probs = torch.tensor(p, dtype=torch.float64).repeat_interleave(groups).unsqueeze(1).expand(-1, size)
        rewards = torch.bernoulli(probs, generator=gen)
        # Every possible group (K successes out of G), for the exact expectation.
        k = torch.arange(size + 1)
        every = (torch.arange(size).unsqueeze(0) < k.unsqueeze(1)).to(torch.float64)
        pmf = np.array([[math.comb(size, int(j)) * q**j * (1 - q) ** (size - j) for j in range(size + 1)] for q in p])
        entry = {"closed_form_drgrpo": closed_form(p, size).tolist()}
        for method in METHODS:
            s = positive_signal(rewards, method, apo_node, anchor).view(p_points, groups)
            exact = pmf @ positive_signal(every, method, apo_node, anchor).numpy()
            entry[method] = {
                "sampled": s.mean(dim=1).tolist(),
                "se": (s.std(dim=1) / math.sqrt(groups)).tolist(),
                "exact": exact.tolist(),
            }
        out["by_G"][str(size)] = entry
    return out


def plot_signal(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = np.asarray(result["p"])
    sizes = list(result["by_G"])
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 4.2), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        entry = result["by_G"][size]
        for i, method in enumerate(METHODS):
            m = entry[method]
            ax.plot(p, m["exact"], color=f"C{i}", lw=1.2, label=f"{method}: exact E[S]")
            ax.errorbar(p, m["sampled"], yerr=2 * np.asarray(m["se"]), fmt="o", ms=3, color=f"C{i}",
                        label=f"{method}: sampled (+-2 SE)")
        ax.plot(p, entry["closed_form_drgrpo"], "k--", lw=1, label="p(1-p)(G-1)")
        ax.axvline(result["anchor"], color="grey", ls=":", lw=1)
        ax.set_title(f"G = {size}")
        ax.set_xlabel("success probability p of the prompt")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("E[S], S = sum_i max(A_i, 0) per group")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        "Positive signal per group. A_i as each estimator returns it: GRPO (R-mean)/std, Dr. GRPO R-mean, "
        f"APO Phi_i (R-mean) with lambda_scale, anchor C_t = {result['anchor']} (dotted)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def signal_markdown(result: dict[str, Any]) -> str:
    p = np.asarray(result["p"])
    picks = [i for i, q in enumerate(p) if any(abs(q - t) < 1e-9 for t in (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95))]
    lines = [
        "# Proposition 1, measured",
        "",
        "S = sum over a group's responses of max(A_i, 0), A_i as the estimator returns it (GRPO: std-normalized; "
        f"Dr. GRPO: centered; APO: Phi_i times centered, lambda_scale included, anchor C_t = {result['anchor']} "
        f"held still). Sampled means over {result['groups']} groups per point; `p(1-p)(G-1)` is the closed form "
        "of Dr. GRPO's E[S].",
        "",
        "| G | p | p(1-p)(G-1) | Dr. GRPO sampled | GRPO sampled | APO sampled | APO / Dr. GRPO |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, entry in result["by_G"].items():
        for i in picks:
            dr, gr, ap = (entry[m]["sampled"][i] for m in ("Dr. GRPO", "GRPO", "APO"))
            ratio = ap / dr if dr > 0 else float("nan")
            lines.append(f"| {size} | {p[i]:.2f} | {entry['closed_form_drgrpo'][i]:.3f} | {dr:.3f} | {gr:.3f} | "
                         f"{ap:.3f} | {ratio:.2f} |")
    worst = max_z(result)
    lines += ["", f"Largest |Dr. GRPO sampled - closed form| / SE over all points: {worst:.2f}.", ""]
    return "\n".join(lines)


def max_z(result: dict[str, Any], method: str = "Dr. GRPO", against: str = "closed_form_drgrpo") -> float:
    """The largest deviation of a sampled curve from a reference, in standard errors (0 where both are exact)."""
    worst = 0.0
    for entry in result["by_G"].values():
        sampled, se = np.asarray(entry[method]["sampled"]), np.asarray(entry[method]["se"])
        ref = np.asarray(entry[against] if against in entry else entry[method][against])
        gap = np.abs(sampled - ref)
        z = np.where(se > 0, gap / np.where(se > 0, se, 1.0), np.where(gap > 1e-9, np.inf, 0.0))
        worst = max(worst, float(z.max()))
    return worst


def run_signal(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    s = cfg.signal
    apo_node = OmegaConf.to_container(cfg.algorithm.apo, resolve=True)
    result = measure(list(s.group_sizes), s.p_points, s.groups, s.anchor, apo_node, s.seed)
    (out_dir / "signal.json").write_text(json.dumps(result, indent=1))
    (out_dir / "signal.md").write_text(signal_markdown(result))
    plot_signal(result, out_dir / "signal.png")
    return result
