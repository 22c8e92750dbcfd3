"""What the whole-loop tests of tests/e2e share: launching a rehearsal run as a user would, and reading what it
left (checkpoints, metrics, dumps). Each run is one real ``python -m recipe_apo.main ... rehearsal=cpu`` (Ray,
TransferQueue, the agent loop with the ``hf`` rollout, the reward loop, the FSDP2 actor, the estimator in the
driver, the loss in the worker, checkpoints, the file logger) on the tiny model and dataset of
``recipe_apo.cpu.make_tiny``; about a minute a Ray session on 2 cores (mostly the start: every Ray worker
imports torch, transformers and verl)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from helpers.paths import ROOT
from recipe_apo.cpu import rehearse

STATE_FILE = "apo_state.json"  # APO's state file (recipe_apo.methods.apo's declaration)

README = ROOT / "README.md"
SOURCES = ("tiny_add", "tiny_reverse")

# A hung run fails its tests instead of holding CI (whose own bound is 90 minutes). A job takes one to three minutes
# here, but took 6:15 in a CI run on a slower hour while the other xdist worker ran the real-model job
# (CoDaPO's in tests/vllm/test_baselines.py, 1:13 alone here; that three-job multirun then hit a 600-s bound set
# for the whole command): 15 minutes a job.
RUN_TIMEOUT_S = 900


def run(command, workdir: Path, name: str, metrics: Path, env_extra=None, jobs: int = 1) -> rehearse.RunResult:
    """``command`` run as a user would, logged to ``workdir/<name>.log``; ``jobs``, the Hydra multirun's job count,
    scales the time bound (each job is its own Ray session)."""
    env = {**rehearse.rehearsal_env(metrics), **(env_extra or {})}
    return rehearse.run_logged(command, workdir / f"{name}.log", cwd=workdir, env=env, label=name,
                               timeout=RUN_TIMEOUT_S * jobs)


def readme_plain_verl_command() -> list[str]:
    """README's plain-verl command (``python -m verl.trainer.main_ppo ...``) as its arguments, ``$HOME`` kept."""
    text = README.read_text()
    start = text.index("python -m verl.trainer.main_ppo \\")
    return shlex.split(text[start:text.index("```", start)].replace("\\\n", " "))


def run_readme_plain_verl(tiny: dict, workdir: Path, name: str, replaced: tuple[str, ...], *extra: str
                          ) -> rehearse.RunResult:
    """README's plain ``python -m verl.trainer.main_ppo`` command on the tiny model and data, one step, saved: the
    arguments starting with one of ``replaced`` dropped, the CPU's (``+rehearsal=cpu``) and ``extra`` added."""
    readme = [arg for arg in readme_plain_verl_command()[3:] if not arg.startswith(replaced)]
    command = [
        sys.executable, "-m", "verl.trainer.main_ppo", "hydra.searchpath=[pkg://recipe_apo.conf]", "+rehearsal=cpu",
        *readme, *rehearse.tiny_overrides(tiny), *rehearse.RUN_OVERRIDES, *extra,
        f"trainer.experiment_name={name}", "trainer.total_training_steps=1", "trainer.save_freq=1",
        "trainer.val_before_train=false",
    ]
    return run(command, workdir, name, workdir / "metrics",
               env_extra={"VERL_USE_EXTERNAL_MODULES": "recipe_apo.cpu.activate"})


def tail(result: rehearse.RunResult, lines: int = 40) -> str:
    return "\n".join(result.log.read_text().splitlines()[-lines:])


def checkpoint_root(workdir: Path, experiment: str) -> Path:
    return workdir / "checkpoints" / rehearse.PROJECT / experiment


def state(folder: Path) -> dict:
    return json.loads((folder / STATE_FILE).read_text())


def runtime_state(folder: Path) -> dict:
    """The APO runtime's own state in ``folder``'s state file: the file less the codec's ``kind`` and
    ``global_step`` (what ``AnchorBook.load_state_dict`` takes; it refuses keys it does not write)."""
    return {key: value for key, value in state(folder).items() if key not in ("kind", "global_step")}



def dump(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def train_then_resume(paths: dict, workdir: Path, args, steps: int, engine: str = "hf") -> dict:
    """One method=apo command run for ``steps`` steps, then the same command for one more (a resume): the
    checkpoint folder, the first run's log and both runs' metric rows, in step order."""
    from recipe_apo.cpu import rehearse

    runs = {}
    for name, total in (("first", steps), ("second", steps + 1)):
        result = run(rehearse.recipe_command(["apo"], paths, *args, f"trainer.total_training_steps={total}",
                                             engine=engine), workdir, name, workdir / "metrics" / name)
        assert result.returncode == 0, tail(result)
        runs[name] = result
    (experiment,) = rehearse.experiment_names(runs["first"].log)
    rows = [row for name in runs
            for row in rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / name, experiment))]
    return {"ckpt": checkpoint_root(workdir, experiment), "log": runs["first"].log, "rows": rows}


def assert_each_checkpoint_holds_its_steps_anchor(rows: list[dict], ckpt: Path) -> None:
    """Each saved anchor is the previous one moved by that step's logged batch success (the first from the default
    start): what a resume restores is the anchor of the step it resumes after."""
    from recipe_apo.methods.apo.anchor import AnchorBook
    from recipe_apo.methods.apo.settings import ApoSettings

    settings, book = ApoSettings(), AnchorBook()
    for row in rows:
        book.anchor().update(row["apo/batch_success"], settings.eta, settings.eta_min, settings.history)
        saved = state(ckpt / f"global_step_{row['step']}")
        assert saved["global_step"] == row["step"]
        assert book.state_dict()["anchors"] == saved["anchors"], row["step"]
