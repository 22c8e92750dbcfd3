"""Quiet endings (``recipe_apo.integration.quiet``): the recipe's CPU tools end with their result, not with
verl's warnings about the accelerators and engines a CPU machine has not; every other warning still shows, and
the training entry (``python -m recipe_apo.main``) keeps all of verl's."""

import ast
import logging
import os
import subprocess
import sys

import pytest
from helpers.composing import LAUNCHABLE
from helpers.paths import ROOT

from recipe_apo.integration import quiet

# What verl prints on a CPU machine (verl/workers/engine/__init__.py, verl/plugin/platform/platform_manager.py).
KNOWN = [
    "No supported accelerator detected",
    "is registered but not available",
    *(f"UserWarning: {engine} engine is not available: " for engine in quiet.ENGINES),
]

# After the entry point's own end, in its process: warnings it must not hide, then the known ones again (hidden),
# then a child process that gives one of each.
AFTER = """
import logging, subprocess, sys, warnings
warnings.warn_explicit("a verl warning the recipe does not know", UserWarning, "engine.py", 1,
                       module="verl.workers.engine")
warnings.warn("megatron engine is not available, said by someone else", UserWarning)
warnings.warn_explicit("veomni engine is not available: as a DeprecationWarning", DeprecationWarning, "e.py", 2,
                       module="verl.workers.engine")
platform = logging.getLogger("verl.plugin.platform.platform_manager")
platform.warning("Platform detection said something new")
platform.warning("No supported accelerator detected. Registered: %s. Falling back to 'nvidia'.", ("nvidia",))
warnings.warn_explicit("torchtitan engine is not available: again", UserWarning, "e.py", 3,
                       module="verl.workers.engine")
subprocess.run([sys.executable, "-c", "import warnings; "
                "warnings.warn_explicit('automodel engine is not available: x', UserWarning, 'c.py', 1, "
                "module='verl.workers.engine'); "
                "warnings.warn_explicit('a child warning the recipe does not know', UserWarning, 'c.py', 2, "
                "module='verl.workers.engine')"], check=True)
"""
UNKNOWN = [
    "a verl warning the recipe does not know",
    "megatron engine is not available, said by someone else",
    "veomni engine is not available: as a DeprecationWarning",
    "Platform detection said something new",
    "a child warning the recipe does not know",
]


def clean_env() -> dict:
    # VERL_*: another test in this process may have turned the CPU rehearsal on (recipe_apo.cpu.activate sets
    # VERL_PLATFORM=cpu), which silences verl's platform warnings by itself.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", quiet.ENV) and not k.startswith("VERL_")}


@pytest.mark.fresh_process
def test_the_demo_ends_with_its_result_and_unknown_warnings_still_show():
    # python -m recipe_apo, then AFTER in the same process. DeprecationWarnings show by default only in __main__:
    # "default" makes every category visible, so that only the recipe's filters can hide one.
    script = ("import runpy, sys, warnings; warnings.simplefilter('default'); sys.argv = ['recipe_apo']; "
              "runpy.run_module('recipe_apo', run_name='__main__', alter_sys=True)\n" + AFTER)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(),
                            cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("trainer.n_gpus_per_node=8 trainer.save_freq=50")
    for line in KNOWN:
        assert line not in result.stderr, f"{line!r} in\n{result.stderr}"
    for line in UNKNOWN:
        assert line in result.stderr, f"{line!r} missing from\n{result.stderr}"


@pytest.mark.fresh_process
def test_the_training_entry_keeps_verls_warnings_and_never_loads_the_cpu_rehearsal(tmp_path):
    """A GPU run's process: the recipe entry's dry run, its trainer, task runner and checkpoint hooks, and verl's
    trainer. verl's warnings all show, the platform is verl's own, and recipe_apo.cpu is never imported."""
    script = (
        "import runpy, sys\n"
        "sys.argv = ['recipe_apo.main', 'method=apo', 'actor_rollout_ref.rollout.name=vllm',"
        f" 'actor_rollout_ref.rollout.n=2', 'dry_run=true', *{LAUNCHABLE!r}]\n"
        "import recipe_apo.integration.trainer, recipe_apo.integration.task_runner, recipe_apo.integration.checkpoint\n"
        "import recipe_apo.integration.quiet\n"
        "runpy.run_module('recipe_apo.main', run_name='__main__')\n"
        "import verl.trainer.ppo.ray_trainer\n"
        "from verl.plugin.platform import get_platform\n"
        "print(sorted(m for m in sys.modules if m.startswith('recipe_apo.cpu')), type(get_platform()).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=clean_env(),
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[] PlatformCUDA"
    for line in KNOWN:
        assert line in result.stderr, f"{line!r} missing from\n{result.stderr}"


def _installs_under_main(path) -> bool:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            return any("quiet.install()" in ast.unparse(statement) for statement in node.body)
    return False


def test_each_tool_installs_it_when_run_and_the_training_entry_does_not():
    package = ROOT / "recipe_apo"
    for tool in ("__main__.py", "cpu/rehearse.py", "testbed/__main__.py", "audit/__main__.py"):
        assert _installs_under_main(package / tool), tool
    assert "quiet" not in (package / "main.py").read_text()


def test_a_child_environment_carries_it_after_the_users_own():
    env = quiet.child_env({"PYTHONWARNINGS": "error::ResourceWarning", "PATH": os.environ["PATH"]})
    entries = env["PYTHONWARNINGS"].split(",")
    assert entries[0] == "error::ResourceWarning" and entries[1:] == list(quiet.warning_options())
    assert env[quiet.ENV] == "1" and env["PATH"] == os.environ["PATH"]
    assert quiet.child_env(env) == env  # nothing twice
    # Every entry is a valid -W option (Python says "Invalid -W option ignored" otherwise).
    result = subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and result.stderr == ""


def test_the_log_filter_drops_only_the_known_records():
    def record(name, level, message, *args):
        return logging.LogRecord(name, level, "platform_manager.py", 1, message, args, None)

    keep = quiet.KnownHarmless().filter
    assert not keep(record(quiet.PLATFORM_LOGGER, logging.WARNING,
                           "No supported accelerator detected. Registered: %s. Falling back to 'nvidia'.",
                           ("nvidia", "huawei")))
    assert not keep(record(quiet.PLATFORM_LOGGER, logging.WARNING, "Platform '%s' (%s) is registered but not "
                           "available. This may be due to this ray actor being a CPU-only actor.", "nvidia",
                           "PlatformCUDA"))
    assert keep(record(quiet.PLATFORM_LOGGER, logging.ERROR, "No supported accelerator detected. Registered: "
                       "(). Falling back to 'nvidia'."))  # another level
    assert keep(record("verl.somewhere_else", logging.WARNING, "No supported accelerator detected. Registered: "
                       "(). Falling back to 'nvidia'."))  # another logger
    assert keep(record(quiet.PLATFORM_LOGGER, logging.WARNING, "Platform 'nvidia' failed in a new way"))


def test_the_rehearsals_runs_start_quiet(tmp_path):
    from recipe_apo.cpu.rehearse import rehearsal_env

    env = rehearsal_env(tmp_path)
    assert env[quiet.ENV] == "1" and env["VERL_FILE_LOGGER_ROOT"] == str(tmp_path)
    assert set(quiet.warning_options()) <= set(env["PYTHONWARNINGS"].split(","))
    # What that environment does in a child (the recipe's runs and their Ray workers are such children).
    script = ("import warnings\n"
              "for engine in ('torchtitan', 'veomni', 'automodel', 'mindspeed', 'megatron'):\n"
              "    warnings.warn_explicit(f'{engine} engine is not available: x', UserWarning, 'e.py', 1,\n"
              "                           module='verl.workers.engine')\n"
              "warnings.warn_explicit('Disabled critic', UserWarning, 't.py', 1, module='verl.trainer')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert "engine is not available" not in result.stderr and "Disabled critic" in result.stderr
