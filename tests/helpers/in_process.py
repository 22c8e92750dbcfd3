"""``python -m recipe_apo.main ARGS`` in the test's own process: Hydra's real entry (``sys.argv``, its multirun,
``--cfg``, its exit codes), without the 6 to 7 CPU-seconds a new interpreter spends importing verl. For the checks
of what the entry composes, names, refuses and prints; the process itself (its exit status, its last line, no
traceback) keeps a test of its own (tests/integration/test_recipe.py, test_a_bad_setting_stops_the_launch_...)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path
from subprocess import CompletedProcess
from typing import Callable


def run_recipe_main(*args: str, cwd: Path) -> CompletedProcess:
    """What the process would have printed and its exit code; the caller's working directory, ``sys.argv`` and
    logging handlers (Hydra configures logging per job) are restored afterwards."""
    from recipe_apo import main as recipe_main

    def entry() -> None:
        sys.argv = ["recipe_apo.main", *args]
        recipe_main.main()

    return run_entry(entry, "recipe_apo.main", *args, cwd=cwd)


def run_entry(entry: Callable[[], None], name: str, *args: str, cwd: Path) -> CompletedProcess:
    """``entry()`` (a command's main function, given its arguments) run as ``python -m name ARGS`` would run in
    ``cwd``: what it printed and its exit code, with ``sys.argv``, the working directory and logging restored."""
    argv, where = sys.argv, os.getcwd()
    loggers = [logging.getLogger(), logging.getLogger("hydra")]
    saved = [(logger, logger.handlers[:], logger.level) for logger in loggers]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                entry()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.argv = argv
        os.chdir(where)
        for logger, handlers, level in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level)
    return CompletedProcess([name, *args], code, out.getvalue(), err.getvalue())
