"""The audit's report: markdown tables and one figure, for one run or several side by side."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from recipe_apo.audit.analysis import CELLS
from recipe_apo.audit.dumps import MAX_LENGTH, AuditError, cut_short
from recipe_apo.integration.replay import methods


def method_names() -> tuple[str, ...]:
    """The replayed methods' titles, in the columns' order (composed on first use, not at import)."""
    return tuple(m.name for m in methods())


def _f(value: Optional[float], fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def report_markdown(results: Sequence[dict[str, Any]], figure: Optional[str] = "audit.png") -> str:
    # A "|" in a run's name would end its table cell.
    results = [{**r, "name": r["name"].replace("|", "\\|")} for r in results]
    sections = (_overview(results, figure), _dead_section(results), _difficulty_section(results),
                _length_section(results), _mass_section(results), _scale_section(results),
                _staleness_section(results), _logged_section(results))
    return "\n".join(line for section in sections for line in section) + "\n"


def _overview(results: Sequence[dict[str, Any]], figure: Optional[str]) -> list[str]:
    """The title, what was replayed with which APO settings, one row per run, and the figure."""
    first_apo = results[0]["apo_settings"]
    lines = [
        "# Bias audit",
        "",
        "Every method is applied to the same rollouts, the run's own scores, lengths and prompt groups, whatever "
        "the run trained with: GRPO (std-normalized advantages, per-token weight 1/|o_i|), Dr. GRPO (centered, "
        "1/L0), APO (centered x Phi_i, the anchor C_t replayed over the steps from a fresh start; 1/L0), AGPO "
        "(GRPO's on its training rewards, the length bonus read from each response's length, its preset's "
        "algorithm.agpo; token-mean). "
        f"APO settings of the replay: lambda_scale {first_apo['lambda_scale']}, eta {first_apo['eta']}, "
        f"eta_min {first_apo['eta_min']}, history {first_apo['history']}, anchor_scope {first_apo['anchor_scope']}.",
        "",
        "| run | steps | responses | groups per step | lengths in | truncation known |",
        "|---|---:|---:|---:|---|---|",
    ]
    for r in results:
        steps = r["steps"]
        per_step = sorted({s["groups"] for s in steps})
        lines.append(f"| {r['name']} | {len(steps)} | {sum(s['responses'] for s in steps)} | "
                     f"{', '.join(map(str, per_step))} | {r['length_unit']} | "
                     f"{'yes' if r['length']['truncated_share'] is not None else 'no'} |")
    if any(r["length_unit"] == "characters" for r in results):
        lines += ["", "Lengths in characters: the dump has no token lengths; pass `--tokenizer MODEL` to count "
                      "tokens (the recipe's trainer writes them). AGPO's length bonus reads them too: its replay is "
                      "exact with the dump's token lengths only."]
    if figure:
        lines += ["", f"![audit]({figure})"]
    return lines


def _dead_section(results: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["", "## 1. Dead groups: no signal", "",
             "Every response of the group scored the same: its advantages are 0 under all three methods, yet its "
             "tokens were generated.", "",
             "| run | dead groups | all wrong | all right | generated tokens spent on them |",
             "|---|---:|---:|---:|---:|"]
    for r in results:
        d = r["dead"]
        lines.append(f"| {r['name']} | {_pct(d['share'])} | {_pct(d['all_wrong_share'])} | "
                     f"{_pct(d['all_right_share'])} | {_pct(d['token_share'])} |")
    return lines


def _difficulty_section(results: Sequence[dict[str, Any]]) -> list[str]:
    """One table per run; each table, this section's last, ends in a blank line."""
    names = method_names()
    lines = ["", "## 2. Difficulty (Proposition 1)", "",
             "Mean positive signal S+ = sum_i max(A_i, 0) and negative signal S- = sum_i max(-A_i, 0) per group, "
             "by the group's success rate p_hat = k/G, beside p(1-p)(G-1), Dr. GRPO's E[S+] over groups of a "
             "prompt whose success probability is p = p_hat (Proposition 1); a group observed with k successes "
             "has exactly S+ = k(G-k)/G = G p_hat(1-p_hat) under Dr. GRPO. GRPO's division by the group's std "
             "flattens the curve (extreme groups have "
             "the smallest std); APO's Phi_i raises the positive signal of groups below its anchor and the "
             "negative signal of groups above it.", ""]
    for r in results:
        lines += [f"**{r['name']}**", "",
                  "| G | p_hat | groups | p(1-p)(G-1) | " + " | ".join(f"{m} S+ / S-" for m in names) + " |",
                  "|---:|---:|---:|---:|" + "---:|" * len(names)]
        for row in r["difficulty"]:
            cells = " | ".join(f"{row[m]['positive']:.3f} / {row[m]['negative']:.3f}" for m in names)
            lines.append(f"| {row['G']} | {row['k']}/{row['G']} | {row['groups']} | {row['closed_form']:.3f} | "
                         f"{cells} |")
        lines.append("")
    return lines


def _length_section(results: Sequence[dict[str, Any]]) -> list[str]:
    """Opens without a blank line: the difficulty section ends in one."""
    lines = ["## 3. Length", "",
             "| run | length of correct | of incorrect | first step: correct / incorrect | last step | truncated |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        length, first, last = r["length"], r["steps"][0], r["steps"][-1]
        lines.append(f"| {r['name']} | {_f(length['correct_mean'], '.1f')} | {_f(length['incorrect_mean'], '.1f')} | "
                     f"{_f(first['length_correct'], '.1f')} / {_f(first['length_incorrect'], '.1f')} | "
                     f"{_f(last['length_correct'], '.1f')} / {_f(last['length_incorrect'], '.1f')} | "
                     f"{_pct(length['truncated_share'])} |")
    return lines


def _mass_section(results: Sequence[dict[str, Any]]) -> list[str]:
    """The length section's second table: where each method's update goes."""
    names = method_names()
    lines = ["", "Share of each method's update (update mass |A_i| x |o_i| x per-token weight, summed over the "
                 "run) carried by correct and wrong responses no longer than the step's median length (short) "
                 "or longer (long). With 1/|o_i| every response carries |A_i| whatever its length; with 1/L0 a "
                 "response carries in proportion to its length.", "",
             "| run | method | short correct | long correct | short wrong | long wrong |",
             "|---|---|---:|---:|---:|---:|"]
    for r in results:
        for m in names:
            mass = r["mass"][m]
            lines.append(f"| {r['name']} | {m} | " + " | ".join(_pct(mass[c]) for c in CELLS) + " |")
    return lines


def _scale_section(results: Sequence[dict[str, Any]]) -> list[str]:
    names = method_names()
    lines = ["", "## 4. Scale", "",
             "|A_i| over every response of the run: APO's soft gate is what bounds the effective update of its "
             "larger advantages.", "",
             "| run | method | mean abs(A) | 99th percentile | max |", "|---|---|---:|---:|---:|"]
    for r in results:
        for m in names:
            s = r["scale"][m]
            lines.append(f"| {r['name']} | {m} | {s['mean']:.3f} | {s['p99']:.3f} | {s['max']:.3f} |")
    return lines


def _staleness_section(results: Sequence[dict[str, Any]]) -> list[str]:
    """Only for runs whose dump carries verl's policy lag; no section when none does."""
    names = method_names()
    stale = [r for r in results if "staleness" in r]
    if not stale:
        return []
    lines = ["", "## 5. Staleness", "",
             "Asynchronous trainers train on responses from older weights: verl's lag of each response in "
             "weight versions (the dump's policy_lag), the share of responses at each lag and of each "
             "method's update mass. (The soft gate's and the clip's weights act per token in the actor and "
             "are not in the dump: verl logs their step means, e.g. actor/apo_gate_weight.)", "",
             "| run | policy lag | responses | " + " | ".join(f"{m} update mass" for m in names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for r in stale:
        for lag, share in r["staleness"]["response_share"].items():
            masses = [_pct(r["staleness"]["mass"][m].get(lag, 0.0)) for m in names]
            lines.append(f"| {r['name']} | {lag} | {_pct(share)} | " + " | ".join(masses) + " |")
    return lines


def _logged_section(results: Sequence[dict[str, Any]]) -> list[str]:
    """Only for runs whose dump carries the advantages they trained with; no section when none does."""
    names = method_names()
    logged = [r for r in results if "logged" in r]
    if not logged:
        return []
    lines = ["", "## The runs' own advantages", "",
             "The dump carries the advantages each run trained with (the recipe's trainer writes them). The "
             "replay that reproduces them tells the run's method and that the replay is faithful.", "",
             "| run | matches | " + " | ".join(f"max abs difference to {m}" for m in names) + " |",
             "|---|---|" + "---:|" * len(names)]
    for r in logged:
        gaps = r["logged"]["max_abs_difference"]
        lines.append(f"| {r['name']} | {', '.join(r['logged']['matches']) or 'none'} | "
                     + " | ".join(f"{gaps[m]:.2g}" for m in names) + " |")
    return lines


def pooled_difficulty(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean S+ per method by (G, k), over the groups of every run (weighted by their counts)."""
    names = method_names()
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for r in results:
        for row in r["difficulty"]:
            cell = cells.setdefault((row["G"], row["k"]), {"p_hat": row["p_hat"], "closed_form": row["closed_form"],
                                                           "groups": 0, **dict.fromkeys(names, 0.0)})
            cell["groups"] += row["groups"]
            for m in names:
                cell[m] += row[m]["positive"] * row["groups"]
    for cell in cells.values():
        for m in names:
            cell[m] /= cell["groups"]
    return [cells[key] for key in sorted(cells)]


def plot_audit(results: Sequence[dict[str, Any]], path: Any) -> None:
    """The figure, into ``path`` (a file name or a binary file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Run names are text as given: "$" in one (a --name, a folder's name) is no TeX for matplotlib to parse.
    with plt.rc_context({"text.parse_math": False}):
        _plot(plt, results, path)


def _plot(plt: Any, results: Sequence[dict[str, Any]], path: Any) -> None:
    names = method_names()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (dead_ax, signal_ax), (length_ax, mass_ax) = axes
    for i, r in enumerate(results):
        steps = [s["step"] for s in r["steps"]]
        dead_ax.plot(steps, [s["dead_share"] for s in r["steps"]], marker="o", ms=3, label=r["name"])
        right = [s["length_correct"] if s["length_correct"] is not None else float("nan") for s in r["steps"]]
        wrong = [s["length_incorrect"] if s["length_incorrect"] is not None else float("nan") for s in r["steps"]]
        length_ax.plot(steps, right, color=f"C{i}", marker="o", ms=3, label=f"{r['name']}: correct")
        length_ax.plot(steps, wrong, color=f"C{i}", ls="--", marker="x", ms=3, label=f"{r['name']}: incorrect")
    rows = pooled_difficulty(results)
    for j, m in enumerate(names):
        signal_ax.plot([row["p_hat"] for row in rows], [row[m] for row in rows], color=f"C{j}", marker="o", ms=3,
                       label=m)
    signal_ax.plot([row["p_hat"] for row in rows], [row["closed_form"] for row in rows], "k--", lw=1,
                   label="p(1-p)(G-1)")
    dead_ax.set(title="1. dead groups (every score equal)", xlabel="step", ylabel="share of groups", ylim=(0, 1))
    pooled = " (groups of all runs)" if len(results) > 1 else ""
    signal_ax.set(title=f"2. positive signal S+ per group{pooled}", xlabel="group success rate p_hat",
                  ylabel="mean S+")
    length_ax.set(title="3a. response length", xlabel="step", ylabel=f"length ({results[0]['length_unit']})")
    width = 0.8 / max(len(results), 1)
    for i, r in enumerate(results):
        for j, m in enumerate(names):
            mass = r["mass"][m]
            x = j + (i - (len(results) - 1) / 2) * width
            mass_ax.bar(x - width / 4, mass["short_correct"], width / 2, color=f"C{i}", alpha=0.9,
                        label=f"{r['name']}: short correct" if j == 0 else None)
            mass_ax.bar(x + width / 4, mass["long_wrong"], width / 2, color=f"C{i}", alpha=0.45, hatch="//",
                        label=f"{r['name']}: long wrong" if j == 0 else None)
    mass_ax.set_xticks(range(len(names)), names)
    mass_ax.set(title="3b. share of the update: short correct, long wrong", ylabel="share of update mass",
                ylim=(0, 1))
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_out_folder(out_dir: Path) -> None:
    """Refuse, before any dump is read, an ``--out`` the report cannot be written into: a file, or a path under
    a file or an unwritable folder. Nothing is created here: a refused audit leaves ``--out`` as it was."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise AuditError(f"--out {out_dir}: a file, not a folder")
    existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise AuditError(f"--out {out_dir}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise AuditError(f"--out {out_dir}: {existing} is not writable")


def write_report(results: Sequence[dict[str, Any]], out_dir: Path, plots: bool = True) -> dict[str, Path]:
    out_dir = Path(out_dir)
    check_out_folder(out_dir)
    try:
        # allow_nan=False: a NaN must never reach the report; every text is made before any file is written.
        numbers = json.dumps(list(results), indent=1, allow_nan=False)
    except ValueError:
        raise AuditError("the audit's numbers hold a NaN or an infinity: a bug of the audit (please report it "
                         "with the dump); nothing was written") from None
    report = report_markdown(results, figure="audit.png" if plots else None)
    figure = io.BytesIO()
    if plots:
        plot_audit(results, figure)
    paths = {"report": out_dir / "report.md", "numbers": out_dir / "audit.json"}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if plots:
            paths["figure"] = out_dir / "audit.png"
            paths["figure"].write_bytes(figure.getvalue())
        paths["report"].write_text(report, encoding="utf-8")
        paths["numbers"].write_text(numbers, encoding="utf-8")
    except OSError as exc:
        raise AuditError(f"--out {out_dir}: cannot write the report ({exc.strerror or exc})") from None
    return paths


def audit_folders(folders: Sequence[Path], out_dir: Path, names: Sequence[Optional[str]] = (), tokenizer: Any = None,
                  max_response_length: Optional[int] = None, apo: Optional[dict] = None, plots: bool = True,
                  say=None) -> dict[str, Path]:
    """Load, audit and report several runs' dumps side by side (``python -m recipe_apo.audit``'s work).

    The arguments are checked before any dump is read: ``--out``, one name per run (when names are given) and
    no two runs of one name (the report tells runs apart by name)."""
    from recipe_apo.audit.analysis import audit_run
    from recipe_apo.audit.dumps import check_data_sources, load_run, rollout_folder, run_name
    from recipe_apo.methods.apo.settings import ApoSettings

    check_out_folder(Path(out_dir))
    if names and len(names) != len(folders):
        raise AuditError(f"--name given {len(names)} times for {len(folders)} RUN_DIRs: give one per RUN_DIR, in "
                         "their order, or none")
    if any(not name or not name.strip() for name in names):
        raise AuditError("--name: an empty name")
    if max_response_length is not None and (isinstance(max_response_length, bool)
                                            or not isinstance(max_response_length, int)
                                            or not 1 <= max_response_length <= MAX_LENGTH):
        # The command line's own rule (__main__._token_cap), for a caller of this function.
        raise AuditError(f"--max-response-length must be a whole number of tokens from 1 to 2^53, got "
                         f"{cut_short(repr(max_response_length))}")
    folders = [rollout_folder(Path(folder)) for folder in folders]
    names = list(names) or [run_name(folder) for folder in folders]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise AuditError(f"two runs are named {name!r} ({folders[names.index(name)]} and {folders[index]}): "
                             "name them apart with --name, once per RUN_DIR")

    results = []
    for index, folder in enumerate(folders):
        run = load_run(folder, tokenizer, max_response_length, name=names[index])
        if ApoSettings.from_algorithm_config({"apo": dict(apo or {})}).anchor_scope == "data_source":
            check_data_sources(run, "--apo anchor_scope=data_source")  # a refusal before the run's progress line
        if say is not None:
            say(f"[{index + 1}/{len(folders)}] {run.name}: {len(run.steps)} steps ({run.folder})")
        results.append(audit_run(run, apo))
    return write_report(results, Path(out_dir), plots=plots)
