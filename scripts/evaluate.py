#!/usr/bin/env python
"""pass@1 of a model on the paper's five benchmarks, as a markdown table laid out like the paper's (section 5.2).

    # a trained verl checkpoint (merged to Hugging Face format first) or any Hugging Face model
    python scripts/evaluate.py --model checkpoints/recipe_apo/qwen2.5-math-1.5b-apo/global_step_640 \\
        --name "1.5B - APO" --ngpus 8
    python scripts/evaluate.py --model Qwen/Qwen2.5-Math-1.5B --name "1.5B - base"

    # CPU only: score generations written earlier, or only tabulate scored files (several = several rows)
    python scripts/evaluate.py --score eval/apo/generations.parquet --name "1.5B - APO"
    python scripts/evaluate.py --table eval/grpo/scores.jsonl eval/drgrpo/scores.jsonl eval/apo/scores.jsonl --paper

Three stages, each of which can run on its own:

1. **merge** (verl checkpoints only): ``python -m verl.model_merger merge --backend fsdp`` turns
   ``global_step_N/actor`` into a Hugging Face folder under ``<out-dir>/hf_model``.
2. **generate** (GPUs): verl's ``python -m verl.trainer.main_generation_server`` serves the model with vLLM and
   answers every prompt of ``<data-dir>/{aime24,amc,math500,minerva,olympiadbench}.parquet`` (made by
   ``scripts/prepare_data.py``: the Qwen-Math prompt) greedily, at most 3,000 tokens, like Dr. GRPO's
   evaluation and the training runs' validation. Output: ``<out-dir>/generations.parquet``.
3. **score** (CPU): every response through ``recipe_apo.reward.compute_score``, the training reward (or the
   ``--reward-path``/``--reward-name`` function, in verl's custom-reward form); one JSON line per problem in
   ``<out-dir>/scores.jsonl``; the table in ``<out-dir>/results.md`` and on stdout.

pass@1 is the mean score per benchmark (over the ``--n`` samples of each problem; greedy: one); "Avg." is the
unweighted mean of the five benchmarks, as in the paper.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import subprocess
import sys
from collections import defaultdict
from typing import Any, Callable, Iterable, Optional, Sequence

# (data_source written by prepare_data.py, column title in the paper's table, problems)
BENCHMARKS: tuple[tuple[str, str, int], ...] = (
    ("aime24", "AIME24", 30),
    ("amc", "AMC", 83),
    ("math500", "MATH500", 500),
    ("minerva", "Minerva", 272),
    ("olympiadbench", "Olympiad Bench", 675),
)

# The training reward, as verl's reward.custom_reward_function names it.
DEFAULT_REWARD_PATH, DEFAULT_REWARD_NAME = "pkg://recipe_apo.reward", "compute_score"

# Section 5.2 of the paper. Its last row is printed there as "7.0B - GMPO-7B (Ours)": APO's 7B row.
PAPER_ROWS: tuple[tuple[str, tuple[float, ...], float], ...] = (
    ("1.5B - GRPO (paper)", (23.3, 49.4, 75.2, 25.7, 39.0), 42.5),
    ("1.5B - Dr. GRPO (paper)", (23.0, 52.1, 77.5, 30.1, 38.5), 44.2),
    ("1.5B - APO (paper)", (25.4, 54.3, 78.9, 31.3, 40.2), 46.0),
    ("7B - GRPO (paper)", (40.1, 59.0, 83.4, 32.4, 41.3), 51.3),
    ("7B - Dr. GRPO (paper)", (43.3, 62.7, 80.7, 33.5, 42.9), 52.6),
    ("7B - APO (paper)", (45.5, 65.6, 84.9, 35.1, 43.5), 54.9),
)


# --------------------------------------------------------------------------------------------------------------
# Table (pure Python: testable anywhere)
# --------------------------------------------------------------------------------------------------------------


def read_scores(path: str) -> list[dict]:
    """Rows of a scores.jsonl: {"benchmark": str, "score": float in [0, 1], ...}, one per problem."""
    from recipe_apo.integration.jsonl import read_rows

    return [row for _, row in read_rows(path, ("benchmark", "score"), "not a scores.jsonl of scripts/evaluate.py")]


def summarize(rows: Iterable[dict]) -> dict[str, tuple[float, int]]:
    """benchmark -> (pass@1 in percent, number of problems)."""
    totals: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        totals[str(row["benchmark"])].append(float(row["score"]))
    return {name: (100.0 * sum(scores) / len(scores), len(scores)) for name, scores in totals.items()}


def table_row(name: str, summary: dict[str, tuple[float, int]]) -> tuple[str, list[Optional[float]], Optional[float]]:
    cells = [summary[key][0] if key in summary else None for key, _, _ in BENCHMARKS]
    average = sum(cells) / len(cells) if all(cell is not None for cell in cells) else None
    return name, cells, average


def _cell(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown_table(rows: Sequence[tuple[str, Sequence[Optional[float]], Optional[float]]]) -> str:
    """The paper's layout: Model | AIME24 | AMC | MATH500 | Minerva | Olympiad Bench | Avg."""
    header = ["Model"] + [title for _, title, _ in BENCHMARKS] + ["Avg."]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for name, cells, average in rows:
        lines.append("| " + " | ".join([name] + [_cell(c) for c in cells] + [_cell(average)]) + " |")
    return "\n".join(lines)


def count_warnings(name: str, summary: dict[str, tuple[float, int]]) -> list[str]:
    warnings = []
    for key, title, expected in BENCHMARKS:
        count = summary.get(key, (0.0, 0))[1]
        if count != expected:
            warnings.append(f"{name}: {title} has {count} scored problems, the paper uses {expected}")
    extra = sorted(set(summary) - {key for key, _, _ in BENCHMARKS})
    if extra:
        warnings.append(f"{name}: not in the paper's table, left out: {', '.join(extra)}")
    return warnings


def tables_from_files(paths: Sequence[str], names: Sequence[str], paper: bool) -> tuple[str, list[str]]:
    rows, warnings = [], []
    for index, path in enumerate(paths):
        name = names[index] if index < len(names) else _default_name(path)
        summary = summarize(read_scores(path))
        warnings += count_warnings(name, summary)
        rows.append(table_row(name, summary))
    if paper:
        rows = [(name, list(cells), average) for name, cells, average in PAPER_ROWS] + rows
    return markdown_table(rows), warnings


def model_label(model: str) -> str:
    """``<experiment>-global_step_N`` for a verl checkpoint (``global_step_N`` alone repeats across runs), else
    the model's last path component."""
    parts = [p for p in model.rstrip("/").split("/") if p]
    if parts and parts[-1] == "actor":
        parts = parts[:-1]
    if len(parts) >= 2 and parts[-1].startswith("global_step_"):
        return f"{parts[-2]}-{parts[-1]}"
    return parts[-1] if parts else model


def _default_name(path: str) -> str:
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return folder or os.path.basename(path)


# --------------------------------------------------------------------------------------------------------------
# Scoring (CPU)
# --------------------------------------------------------------------------------------------------------------


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _as_dict(value: Any) -> dict:
    if isinstance(value, dict):
        return {key: (v.tolist() if hasattr(v, "tolist") and not isinstance(v, (str, bytes)) else v)
                for key, v in value.items()}
    return {}


ScoreMany = Callable[..., list[float]]  # (items, timeout=...) -> scores, as recipe_apo.reward.score_many


def reward_scorer(path: str = DEFAULT_REWARD_PATH, name: str = DEFAULT_REWARD_NAME) -> ScoreMany:
    """The training reward's ``score_many`` (worker processes, timeouts), or a reward function given the way
    verl's ``reward.custom_reward_function`` gives one (a file path or ``pkg://module``, and a name), called
    in order, as verl calls it."""
    if (path, name) == (DEFAULT_REWARD_PATH, DEFAULT_REWARD_NAME):
        from recipe_apo.reward import score_many

        return score_many
    from verl.utils.import_utils import load_extern_object

    compute_score = load_extern_object(path, name)

    def score_one(source, response, truth, extra_info) -> float:
        result = compute_score(data_source=source, solution_str=response, ground_truth=truth, extra_info=extra_info)
        return float(result["score"] if isinstance(result, dict) else result)  # verl takes {"score": ...} too

    def score_many_custom(items: list, timeout: float) -> list[float]:
        # timeout bounds the recipe's reward only: its workers enforce it; a plain function cannot be stopped.
        return [score_one(*item) for item in items]

    return score_many_custom


def score_generations(path: str, out_path: str, timeout: float, score_many: Optional[ScoreMany] = None) -> list[dict]:
    """Score ``responses`` of a generations parquet with the training reward (or ``score_many``, e.g.
    ``reward_scorer(...)``); write scores.jsonl."""
    import pandas as pd

    from recipe_apo.reward import last_boxed_answer

    score_many = score_many or reward_scorer()

    frame = pd.read_parquet(path)
    missing = {"data_source", "reward_model", "responses"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)} (expected main_generation_server's output)")
    items, owners = [], []
    for row_index, row in enumerate(frame.itertuples(index=False)):
        reward_model = _as_dict(row.reward_model)
        extra_info = _as_dict(getattr(row, "extra_info", None))
        for response in _as_list(row.responses):
            text = response if isinstance(response, str) else ""
            items.append((row.data_source, text, reward_model.get("ground_truth"),
                          extra_info))
            owners.append(row_index)
    scores = _score_with_progress(items, timeout, score_many)
    per_row: dict[int, list[float]] = defaultdict(list)
    for owner, score in zip(owners, scores):
        per_row[owner].append(score)
    results = []
    for row_index, row in enumerate(frame.itertuples(index=False)):
        reward_model = _as_dict(row.reward_model)
        extra_info = _as_dict(getattr(row, "extra_info", None))
        responses = _as_list(row.responses)
        row_scores = per_row.get(row_index, [])
        results.append(
            {
                "benchmark": row.data_source,
                "index": extra_info.get("index", row_index),
                "ground_truth": reward_model.get("ground_truth"),
                "answers": [last_boxed_answer(r) if isinstance(r, str) else None for r in responses],
                "scores": row_scores,
                "score": sum(row_scores) / len(row_scores) if row_scores else 0.0,
                "response_chars": [len(r) if isinstance(r, str) else 0 for r in responses],
            }
        )
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as handle:
        for result in results:
            handle.write(json.dumps(result, ensure_ascii=False) + "\n")
    return results


def _score_with_progress(items: list, timeout: float, score_many) -> list[float]:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return score_many(items, timeout=timeout)
    scores: list[float] = []
    chunk = 256
    with tqdm(total=len(items), desc="scoring", unit="response", file=sys.stderr, disable=None) as bar:
        for start in range(0, len(items), chunk):
            scores.extend(score_many(items[start : start + chunk], timeout=timeout))
            bar.update(min(chunk, len(items) - start))
    return scores


# --------------------------------------------------------------------------------------------------------------
# Merge and generation (GPU machine)
# --------------------------------------------------------------------------------------------------------------


def find_actor_checkpoint(path: str) -> Optional[str]:
    """The FSDP actor folder of a verl checkpoint (``global_step_N`` or its ``actor/``), or None."""
    for candidate in (path, os.path.join(path, "actor")):
        if os.path.isfile(os.path.join(candidate, "fsdp_config.json")) or glob.glob(
            os.path.join(candidate, "model_world_size_*_rank_0.pt")
        ):
            return candidate
    return None


def merge_command(python: str, actor_dir: str, target_dir: str) -> list[str]:
    return [python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", actor_dir,
            "--target_dir", target_dir]


def generation_command(python: str, model: str, data_files: Sequence[str], output: str,
                       args: argparse.Namespace) -> list[str]:
    files = "[" + ",".join(data_files) + "]"
    return [
        python, "-m", "verl.trainer.main_generation_server",
        f"data.train_files={files}",
        "data.prompt_key=prompt",
        f"+data.output_path={output}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={args.max_response_length}",  # the rollout's response_length follows it
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        # verl's default, dummy, expects a trainer to sync weights in; a standalone server never gets them.
        "actor_rollout_ref.rollout.load_format=auto",
        f"actor_rollout_ref.rollout.temperature={args.temperature}",
        f"actor_rollout_ref.rollout.top_p={args.top_p}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        # The OpenAI-style server applies the chat template itself: it needs the tokenizer.
        "actor_rollout_ref.rollout.skip_tokenizer_init=false",
        f"trainer.n_gpus_per_node={args.ngpus}",
        "trainer.nnodes=1",
    ] + list(args.generation_override)


def run(command: list[str], dry_run: bool) -> None:
    print("+ " + " ".join(shlex.quote(part) for part in command), file=sys.stderr, flush=True)
    if not dry_run:
        subprocess.run(command, check=True)


def benchmark_files(data_dir: str, names: Sequence[str]) -> list[str]:
    files = [os.path.join(os.path.expanduser(data_dir), f"{name}.parquet") for name in names]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)}: run scripts/prepare_data.py --out-dir {data_dir}")
    return files


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--model", help="Hugging Face model (id or folder) or verl checkpoint (global_step_N[/actor])")
    mode.add_argument("--score", metavar="GENERATIONS", help="score an existing generations parquet (CPU)")
    mode.add_argument("--table", nargs="+", metavar="SCORES", help="tabulate scores.jsonl files, one row each (CPU)")
    parser.add_argument("--name", action="append", default=[],
                        help="row name in the table (repeat for several --table files)")
    parser.add_argument("--out-dir", default=None, help="default: eval/<name of the model or checkpoint>")
    parser.add_argument("--data-dir", default="~/data/recipe_apo", help="where prepare_data.py wrote the benchmarks")
    parser.add_argument("--benchmarks", default=",".join(key for key, _, _ in BENCHMARKS))
    parser.add_argument("--ngpus", type=int, default=8)
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size of each vLLM replica")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--max-prompt-length", type=int, default=1024)
    parser.add_argument("--max-response-length", type=int, default=3000, help="the paper's (and Dr. GRPO's) cap")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy, as Dr. GRPO evaluates")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--n", type=int, default=1, help="samples per problem (needs --temperature > 0 when > 1)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per answer check")
    parser.add_argument("--reward-path", default=DEFAULT_REWARD_PATH,
                        help="reward function's file or pkg://module, as verl's reward.custom_reward_function.path")
    parser.add_argument("--reward-name", default=DEFAULT_REWARD_NAME, help="the reward function's name there")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs verl")
    parser.add_argument("--generation-override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Hydra override for main_generation_server")
    parser.add_argument("--paper", action="store_true", help="put the paper's rows above yours")
    parser.add_argument("--dry-run", action="store_true", help="print the merge and generation commands only")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.table:
        table, warnings = tables_from_files(args.table, args.name, args.paper)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(table)
        return 0

    if args.n > 1 and args.temperature == 0:
        parser.error("--n > 1 needs --temperature > 0 (greedy decoding gives n identical answers)")
    # Loaded first: a wrong --reward-path should fail before the generation's GPU hours, not after.
    score_many = None if args.dry_run else reward_scorer(args.reward_path, args.reward_name)

    if args.score:
        generations = args.score
        out_dir = args.out_dir or os.path.dirname(os.path.abspath(generations))
        name = args.name[0] if args.name else _default_name(generations)
    else:
        model = args.model.rstrip("/")
        name = args.name[0] if args.name else model_label(model)
        out_dir = args.out_dir or os.path.join("eval", name.replace(" ", "_").replace("/", "_"))
        os.makedirs(out_dir, exist_ok=True)
        names = [part.strip() for part in args.benchmarks.split(",") if part.strip()]
        files = benchmark_files(args.data_dir, names) if not args.dry_run else [
            os.path.join(os.path.expanduser(args.data_dir), f"{n}.parquet") for n in names]
        actor_dir = find_actor_checkpoint(model) if os.path.isdir(model) else None
        if actor_dir is not None:
            merged = os.path.join(out_dir, "hf_model")
            if os.path.isfile(os.path.join(merged, "config.json")):
                print(f"[1/3] merged model already in {merged}", file=sys.stderr)
            else:
                print(f"[1/3] merging the FSDP checkpoint {actor_dir} into {merged}", file=sys.stderr)
                run(merge_command(args.python, actor_dir, merged), args.dry_run)
            model = os.path.abspath(merged)
        else:
            print(f"[1/3] {model}: a Hugging Face model, nothing to merge", file=sys.stderr)
        generations = os.path.join(os.path.abspath(out_dir), "generations.parquet")
        print(f"[2/3] generating with verl's generation server on {args.ngpus} GPU(s) -> {generations}",
              file=sys.stderr)
        run(generation_command(args.python, model, files, generations, args), args.dry_run)
        if args.dry_run:
            return 0

    print(f"[3/3] scoring {generations}", file=sys.stderr)
    scores_path = os.path.join(out_dir, "scores.jsonl")
    results = score_generations(generations, scores_path, args.timeout, score_many)
    summary = summarize(results)
    for warning in count_warnings(name, summary):
        print(f"warning: {warning}", file=sys.stderr)
    rows = [table_row(name, summary)]
    if args.paper:
        rows = [(n, list(c), a) for n, c, a in PAPER_ROWS] + rows
    table = markdown_table(rows)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(table + "\n")
    print(f"scores: {scores_path}\ntable: {os.path.join(out_dir, 'results.md')}", file=sys.stderr)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
