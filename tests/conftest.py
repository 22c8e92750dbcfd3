"""Fixtures shared by several layers' tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory) -> dict[str, Path]:
    """``recipe_apo.cpu.make_tiny``'s default model, tokenizer and dataset, built once per test run: by the first
    xdist worker that asks, the others waiting on a lock and reading its paths. Tests only read these files."""
    from filelock import FileLock

    from recipe_apo.cpu.make_tiny import make_tiny

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make_tiny(tmp_path_factory.mktemp("tiny"), progress=None)
    root = tmp_path_factory.getbasetemp().parent / "tiny-shared"  # the run's folder, shared by its workers
    with FileLock(f"{root}.lock"):
        record = root / "paths.json"
        if not record.exists():
            paths = make_tiny(root, progress=None)
            record.write_text(json.dumps({name: str(path) for name, path in paths.items()}))
        return {name: Path(path) for name, path in json.loads(record.read_text()).items()}


@pytest.fixture(autouse=True, scope="module")
def _environment_as_it_was():
    """Each test module leaves ``os.environ`` as it found it. Importing ``recipe_apo.cpu.activate`` turns the CPU
    rehearsal on in the importing process, environment included (``VERL_PLATFORM=cpu`` ...): without this, a
    later module's subprocesses in the same (xdist) worker would inherit it."""
    before = dict(os.environ)
    yield
    for key in set(os.environ) - set(before):
        del os.environ[key]
    os.environ.update(before)
