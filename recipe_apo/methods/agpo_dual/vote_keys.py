"""The answer a response votes for in AGPO's vote entropy H_v (``method=agpo_dual``): its *key*, a string.

``math_vote_key`` is AGPO's own rule (``wandugu/paper_agpo`` at 11e5596, ``_extract_vote_key``, trainer.py
T:370-384), on the stripped text:

1. the content of the last ``\\boxed{...}`` without nested braces, stripped and lower-cased (so
   ``\\boxed{\\frac{1}{2}}`` is not a box here: it falls through to rule 3 and votes ``2``, as in the source);
2. else the text after the last ``####``, stripped and lower-cased (commas kept: ``1,000``);
3. else the last number (commas removed first; signs, decimals and ``a/b`` fractions);
4. else the whole text, whitespace runs made one space, lower-cased: a response without an answer votes for
   its own text, so H_v is always defined (distinct such texts are distinct votes; empty texts vote alike).

Another task gives its own rule with ``algorithm.agpo_dual.vote_key=module:function`` (a function of the response
text returning its key); ``load_vote_key`` resolves it once, with a one-line error naming the setting.

The function runs on every probe response, that is on model output, in the driver. So a ``vote_key`` that names a
function reaching processes, files, the network or the interpreter is refused (``refused_because``), by the name
given and by the module that defines what it names (``mine:f`` with ``f = os.system`` is ``posix``'s ``system``):
a function of the modules in ``REFUSED_MODULES`` (``os``, ``subprocess``, ``shutil``, ``pathlib``, ``sys``,
``importlib``, ``socket``, ..., and the training stack's packages ``torch``, ``numpy``, ... with their loaders and
writers), ``builtins``' ``REFUSED_BUILTINS`` (``open``, ``exec``, ``eval``, ``__import__``, ``input``, ...), and the
recipe's own modules but this one. ``check_vote_key_name`` applies the rule to the setting's text alone and finds
the module without running it: a dry run imports and calls nothing a setting names.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from typing import Any, Callable, Optional

from recipe_apo.errors import RecipeError

_BOXED = re.compile(r"\\boxed\{([^{}]+)\}")
_NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:/[1-9]\d*)?")
_SPACES = re.compile(r"\s+")
# A key is compared, not read: a bounded prefix of a runaway text votes the same as the text.
MAX_TEXT = 100_000


# Top-level modules whose functions start processes, touch files or the network, load code or stop the interpreter
# (Python's, then the training stack's): a vote key names none of their functions.
REFUSED_MODULES = frozenset({
    "os", "posix", "nt", "posixpath", "ntpath", "genericpath", "subprocess", "_posixsubprocess", "shutil", "pathlib",
    "glob", "tempfile", "io", "_io", "codecs", "fileinput", "filecmp", "linecache", "tokenize", "sys", "importlib",
    "imp", "pkgutil", "runpy", "zipimport", "site", "sysconfig", "socket", "_socket", "ssl", "select", "selectors",
    "asyncio", "http", "urllib", "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "xmlrpc", "socketserver",
    "webbrowser", "multiprocessing", "concurrent", "threading", "_thread", "signal", "pty", "tty", "termios", "fcntl",
    "resource", "mmap", "ctypes", "_ctypes", "pickle", "_pickle", "marshal", "shelve", "dbm", "sqlite3", "zipfile",
    "tarfile", "gzip", "bz2", "lzma", "pdb", "bdb", "code", "codeop", "trace", "cProfile", "profile", "platform",
    "getpass", "pwd", "grp", "syslog", "logging", "compileall", "py_compile", "venv", "ensurepip", "pydoc",
    "distutils", "antigravity", "this", "atexit", "faulthandler", "_winapi", "msvcrt", "winreg", "winsound",
    "torch", "numpy", "pandas", "ray", "verl", "vllm", "transformers", "datasets", "huggingface_hub", "requests",
    "fsspec", "safetensors", "hydra", "omegaconf", "tensordict",
})
# builtins' functions that open files, run or import code, read the terminal or stop the interpreter.
REFUSED_BUILTINS = frozenset({"open", "exec", "eval", "compile", "__import__", "input", "breakpoint", "exit", "quit",
                              "help"})
# The recipe's own module of vote keys, whose math_vote_key is the one recipe function that is a key: its other
# functions load keys by name, and the recipe's other modules write checkpoints, dumps and logs.
OWN_MODULE = __name__
RULE = ("a vote key runs on model output in the driver, so none of os, subprocess, shutil, pathlib, sys, importlib, "
        "socket, io and the like, torch, numpy, pandas, ..., builtins' open, exec, eval, __import__, input, ... or the "
        "recipe's modules is one; name a function of your own module")


class VoteKeyError(RecipeError, ValueError):
    """``algorithm.agpo_dual.vote_key`` cannot be loaded, or its function does not return a string."""


def math_vote_key(text: str) -> str:
    """AGPO's answer key of a math response (the module's rules 1-4)."""
    s = str(text)[:MAX_TEXT].strip()
    boxed = _BOXED.findall(s)
    if boxed:
        return boxed[-1].strip().lower()
    if "####" in s:
        return s.rsplit("####", 1)[-1].strip().lower()
    numbers = _NUMBER.findall(s.replace(",", ""))
    if numbers:
        return numbers[-1]
    return _SPACES.sub(" ", s).lower()


# What the launch hands a user's key function once, so that one that raises or takes other arguments is refused
# before Ray starts, not at the first probe.
SAMPLE_RESPONSE = "The sum is 3 + 4 = 7, so the answer is \\boxed{7}."


def refused_because(module_name: str, attribute: str) -> Optional[str]:
    """Why a function ``attribute`` of ``module_name`` may not be a vote key (the module's docstring), or None."""
    module_name = module_name.strip()
    top = module_name.split(".")[0]
    if top in REFUSED_MODULES:
        return f"{top} reaches processes, files, the network or the interpreter"
    if top == "builtins" and attribute.strip() in REFUSED_BUILTINS:
        return f"builtins' {attribute.strip()} opens files, runs or imports code, reads the terminal or exits"
    if top == OWN_MODULE.split(".")[0] and (module_name != OWN_MODULE or attribute.strip() != "math_vote_key"):
        return f"{module_name}'s {attribute.strip()} is the recipe's own (of its functions only math_vote_key is a key)"
    return None


def _split(spec: str) -> tuple[str, str]:
    module_name, _, attribute = str(spec).partition(":")
    if not module_name.strip() or not attribute.strip():
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r}: 'module:function', both named")
    return module_name, attribute


def _refuse(spec: str, module_name: str, attribute: str) -> None:
    reason = refused_because(module_name, attribute)
    if reason is not None:
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} is refused: {reason}; {RULE}")


def check_vote_key_name(spec: Optional[str]) -> None:
    """The dry run's check of ``algorithm.agpo_dual.vote_key``: the rule on the setting's text, and its module found
    on the path without being run (only a dotted name's parent packages are imported, as Python finds modules)."""
    if spec is None:
        return
    module_name, attribute = _split(spec)
    _refuse(spec, module_name, attribute)
    try:
        found = importlib.util.find_spec(module_name.strip())
    except Exception as exc:  # a parent package may raise anything while it is imported
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} cannot be loaded ({type(exc).__name__}: "
                           f"{first})") from None
    if found is None:
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} cannot be loaded (no module named "
                           f"{module_name.strip()!r})")


def _defined_in(function: Any) -> tuple[str, str]:
    """(module, name) that define ``function``: through ``functools.partial`` and decorators' ``__wrapped__``, and a
    bound method's ``__func__``."""
    seen = 0
    while seen < 100:  # a cycle of __wrapped__ ends here
        seen += 1
        if isinstance(function, functools.partial):
            function = function.func
        elif getattr(function, "__wrapped__", None) is not None:
            function = function.__wrapped__
        elif getattr(function, "__func__", None) is not None:
            function = function.__func__
        else:
            break
    module = getattr(function, "__module__", None)
    if not isinstance(module, str):
        module = getattr(type(function), "__module__", "") or ""
    return module, str(getattr(function, "__name__", ""))


def load_vote_key(spec: Optional[str]) -> Callable[[str], str]:
    """The key function of ``algorithm.agpo_dual.vote_key``: ``math_vote_key`` for None, else ``module:function``,
    refused by the module docstring's rule, imported and called once on ``SAMPLE_RESPONSE``: anything that goes
    wrong is one ``VoteKeyError`` line."""
    if spec is None:
        return math_vote_key
    module_name, attribute = _split(spec)
    _refuse(spec, module_name, attribute)  # before the import: the module named is never run
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except Exception as exc:  # a module may raise anything while it is imported (a SyntaxError too)
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} cannot be loaded "
                           f"({type(exc).__name__}: {first})") from None
    if not callable(function):
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} is not a function")
    defined_in, name = _defined_in(function)
    if refused_because(defined_in, name) is not None:  # a user's module that hands over os.system, say
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} is refused: it is {defined_in}'s {name}, and "
                           f"{refused_because(defined_in, name)}; {RULE}")

    def checked(text: str) -> str:
        key = function(text)
        if not isinstance(key, str):
            raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} returned {type(key).__name__}, not a string")
        return key

    try:
        checked(SAMPLE_RESPONSE)
    except VoteKeyError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in a user's function ends nothing here
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise VoteKeyError(f"algorithm.agpo_dual.vote_key={spec!r} fails on a sample response "
                           f"({type(exc).__name__}: {first}): it must take one response's text and return its "
                           "answer as a string") from None
    return checked
