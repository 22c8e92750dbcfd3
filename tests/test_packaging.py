"""The package as a user installs it: ``conf/`` sits at the top of the repository and ships inside the wheel as
``recipe_apo.conf``, so Hydra composes the presets from a built wheel in a fresh environment, from any directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import tomllib
from helpers.paths import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_installed_packages_are_the_trees():
    # setup.py finds them: a new method's package is installed without a list to extend.
    listed = set(json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys, setuptools; setuptools.setup = lambda **kw: print(json.dumps("
         "kw['packages'])); sys.argv = ['setup.py']; exec(open('setup.py').read())"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout))
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "recipe_apo").rglob("__init__.py")}
    assert listed == found | {"recipe_apo.conf"}
    assert "packages" not in PYPROJECT["tool"]["setuptools"]
    assert PYPROJECT["tool"]["setuptools"]["package-dir"] == {"recipe_apo.conf": "conf"}
    assert not (ROOT / "recipe_apo" / "conf").exists() and (ROOT / "conf" / "method" / "apo.yaml").is_file()


COMPOSE = """
import json, sys
from hydra import compose, initialize_config_module
import recipe_apo
out = {"file": recipe_apo.__file__}
with initialize_config_module(config_module="recipe_apo.conf", version_base=None):
    for method in ("grpo", "drgrpo", "apo", "codapo"):
        cfg = compose("apo_trainer", overrides=[f"method={method}"])
        out[method] = [cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.actor.policy_loss.loss_mode]
print(json.dumps(out))
"""


@pytest.mark.fresh_process
def test_a_built_wheel_composes_the_presets_in_a_fresh_environment(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("recipe_apo", "conf"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
                   check=True, cwd=tmp_path)
    wheel, = (tmp_path / "dist").glob("recipe_apo-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"recipe_apo/conf/apo_trainer.yaml", "recipe_apo/conf/method/apo.yaml", "recipe_apo/conf/testbed.yaml",
            "recipe_apo/cpu/agent_loops.yaml"} <= names
    assert {f"recipe_apo/{p.relative_to(ROOT / 'recipe_apo').as_posix()}"
            for p in (ROOT / "recipe_apo").rglob("*.py")} <= names

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True)
    # The fresh environment borrows this one's dependencies (verl, torch, hydra) as a plain path entry: this
    # environment's editable install of the recipe is a .pth hook, which a path entry does not run.
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([str(python), "-c", COMPOSE], cwd=elsewhere, capture_output=True, text=True,
                            check=True)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(out.pop("file")).is_relative_to(env)
    assert out == {"grpo": ["grpo", "vanilla"], "drgrpo": ["grpo", "vanilla"], "apo": ["apo", "apo"],
                   "codapo": ["codapo", "vanilla"]}


def test_the_vllm_plugin_entry_point_loads_neither_verl_nor_torch():
    """vLLM loads the recipe's ``vllm.general_plugins`` entry point in every engine and worker process wherever the
    recipe is installed, GPU runs included: it must import nothing of verl, torch or the methods, and do nothing
    outside the CPU rehearsal (``recipe_apo/__init__.py`` imports nothing)."""
    entry = PYPROJECT["project"]["entry-points"]["vllm.general_plugins"]["recipe_apo_cpu"]
    module, _, function = entry.partition(":")
    code = (f"import sys; import {module} as m; m.{function}(); "
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('verl', 'torch', 'vllm') "
            "or k.startswith('recipe_apo.methods')))")
    env = {key: value for key, value in os.environ.items() if key != "VERL_PLATFORM"}  # not in a rehearsal
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == "[]"
