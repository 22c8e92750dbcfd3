"""Fixtures shared by several layers' tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipe_apo.cpu import vllm_engine

# The files that take longest, first: make test's two xdist workers then finish within a short file of each other
# (longest-processing-time order). The first starts two Ray sessions (about 60 CPU-seconds a session on 2 cores,
# most of it the processes of a run importing torch and verl), the next one session of one step;
# the other whole-loop files follow, then the slowest of the rest (over 20 CPU-seconds each in the fast suite,
# measured; test_trainer.py for its Ray tests), then the rest as collected. xdist's own order (the files with the most
# tests first; pyproject's --no-loadscope-reorder turns it off) started the whole-loop files last and left one worker
# alone at the end. A stale list costs time, not results.
LONGEST_FIRST = ("e2e/test_apo_resume.py", "e2e/test_baselines.py")
SLOW_UNIT_FILES = ("testbed/test_testbed.py", "integration/test_recipe.py", "integration/test_trainer.py",
                   "scripts/test_train_scripts.py", "testbed/test_launch_checks.py",
                   "integration/test_launch_checks.py")


# tests/vllm runs verl's vLLM rollout: collected where vLLM's CPU build is installed (make test-vllm, .venv-vllm).
collect_ignore = [] if vllm_engine.installed() else ["vllm"]

# The marks of the tests that may start Ray (verl's whole loop, a Ray session of the recipe's trainer, a real FSDP2
# step): `make test` leaves them out (`-m "not e2e and not fresh_process"`), `make test-e2e` and `make test-vllm` run
# them (make test-e2e the fresh_process ones too: a fresh Python importing torch and verl, 5-30 s each). A Ray
# session costs 10-80 CPU-seconds of start-up before a test checks anything: the fast suite starts none.
RAY_MARKS = ("e2e", "vllm")
_RAY_ALLOWED = {"now": True}


# torch's intra-op threads in a fast-suite test's process: one, as the testbed gives each of its jobs
# (threads_per_worker=1). make test runs two xdist workers on two cores; with torch's default (a thread per core)
# each worker's OpenMP pool adds a busy thread per core, and their spin-waits cost the testbed's small tensors 10-20
# times their one-thread CPU time (prepare_seed of helpers/testbed_tiny.py's run: 0.64 CPU-seconds on one thread,
# 11-14 on two, on a loaded 2-core host; tests/testbed/test_agpo_dual.py, one pytest process on a lightly loaded
# one: 48 CPU-seconds, 4 on one thread). Ray-marked tests keep torch's default.
_TORCH_THREADS: dict[str, int] = {}


def _set_torch_threads(ray_test: bool) -> None:
    import torch

    default = _TORCH_THREADS.setdefault("default", torch.get_num_threads())
    torch.set_num_threads(default if ray_test else 1)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before the test's fixtures: a package- or module-scoped fixture that starts Ray is set up for its first test.
    _RAY_ALLOWED["now"] = any(item.get_closest_marker(mark) for mark in RAY_MARKS)
    _set_torch_threads(_RAY_ALLOWED["now"])


@pytest.fixture(autouse=True, scope="session")
def _ray_only_in_marked_tests():
    """A test that starts Ray in this process without an ``e2e`` (or ``vllm``) mark fails, naming the mark: the
    fast suite stays fast because no unmarked test can start a session. (A test that starts Ray in a subprocess,
    ``python -m recipe_apo.main`` without ``--cfg job``, is marked by hand.)"""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency
        yield
        return
    init = ray.init

    def guarded_init(*args, **kwargs):
        if not _RAY_ALLOWED["now"]:
            raise RuntimeError("this test starts Ray: mark it @pytest.mark.e2e (make test-e2e runs it; make test, "
                               "the fast suite, starts no Ray session)")
        return init(*args, **kwargs)

    ray.init = guarded_init
    yield
    ray.init = init


# Files that share a Ray session through a package-scoped fixture: make test's workers take each group whole, as
# they take whole files (pyproject's --dist loadfile). Each Ray session costs 10-80 CPU-seconds of start-up.
SHARED_SESSIONS = {"integration/test_multi_output.py": "integration/test_trainer.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which answers for every --dist
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None  # xdist's own scheduler
    from xdist.scheduler import LoadFileScheduling

    class SharedSessionScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            for member, host in SHARED_SESSIONS.items():
                if path.endswith(member):
                    return path[: -len(member)] + host
            return path

    return SharedSessionScheduling(config, log)


# Fixtures that start a Ray session in the test's process: a test that uses one is marked ``e2e``.
RAY_FIXTURES = ("transfer_queue",)


def pytest_collection_modifyitems(items):
    for item in items:
        if set(RAY_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)

    def rank(item) -> int:
        path = item.path.as_posix()
        for position, suffix in enumerate(LONGEST_FIRST):
            if path.endswith(suffix):
                return position
        if "/e2e/" in path:
            return len(LONGEST_FIRST)
        return len(LONGEST_FIRST) + (1 if any(path.endswith(suffix) for suffix in SLOW_UNIT_FILES) else 2)

    items.sort(key=rank)  # stable: each file's tests keep their order


@pytest.fixture(autouse=True, scope="session")
def _parse_each_yaml_text_once():
    """Hydra reads and parses every YAML file of a config at every compose (verl's config: about 35 files, half
    of a compose's 0.6 s in pure-Python YAML and OmegaConf), and the tests compose hundreds of times, in-process
    runs of ``python -m recipe_apo.main`` and the testbed included. While the tests run, each text is parsed once
    per test process and every load gets its own copy: ``OmegaConf.load`` is a function of the text alone. Loads
    by path (files the tests write and read back) go through as they are."""
    import copy
    import io

    from omegaconf import OmegaConf

    parse = OmegaConf.load
    parsed = {}

    def load(file_):
        if isinstance(file_, (str, os.PathLike)) or not hasattr(file_, "read"):
            return parse(file_)
        text = file_.read()
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if text not in parsed:
            parsed[text] = parse(io.StringIO(text))
        return copy.deepcopy(parsed[text])

    OmegaConf.load = load
    yield
    OmegaConf.load = parse


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
