"""A script of scripts/ loaded as a module, and its ``main`` run in this process (a subprocess would import torch,
transformers and verl again) with its output captured."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from subprocess import CompletedProcess
from types import ModuleType

from helpers.paths import ROOT


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``name`` (registered in sys.modules: dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_main(script: ModuleType, *args) -> CompletedProcess:
    """``script.main(args)`` with its stdout and stderr captured, as a CompletedProcess."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = script.main([str(a) for a in args])
    return CompletedProcess(args, code, out.getvalue(), err.getvalue())
