"""Quiet endings for the recipe's CPU tools: verl's warnings known to be harmless on a CPU machine, silenced.

On a machine without an accelerator, importing verl's trainer warns that no accelerator was found and lists every
optional training engine that is not installed. The recipe's own tools run on a CPU on purpose, and use FSDP,
so a newcomer would read those lines, printed after the tool's result, as a failure. ``install()`` silences
exactly them, each matched by its message and category (and its module or logger): any other warning, of verl
or not, still shows. Called by the entry points ``python -m recipe_apo``, ``python -m recipe_apo.cpu.rehearse``,
``python -m recipe_apo.testbed`` and ``python -m recipe_apo.audit`` when run as programs; never by
``python -m recipe_apo.main``, whose warnings stay verl's.

Children inherit it through the environment: ``PYTHONWARNINGS`` (read by every Python interpreter at start,
Ray's workers included) carries the ``warnings`` filters, and ``RECIPE_APO_QUIET=1`` makes this module install
itself when a child imports it (the testbed's worker processes, where they are spawned). ``child_env()`` gives an
explicit subprocess environment the same entries.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Mapping, Optional

ENV = "RECIPE_APO_QUIET"

# warnings.warn(...) that verl's engine package gives at import for each optional engine it cannot import
# (verl/workers/engine/__init__.py): UserWarning "<engine> engine is not available: ModuleNotFoundError(...)".
ENGINE_MODULE = "verl.workers.engine"
ENGINES = ("torchtitan", "veomni", "automodel", "mindspeed", "megatron")
WARNINGS = tuple((UserWarning, ENGINE_MODULE, f"{engine} engine is not available") for engine in ENGINES)

# What verl logs through `logging` while it looks for an accelerator (verl/plugin/platform/platform_manager.py),
# as (logger, level, message pattern).
PLATFORM_LOGGER = "verl.plugin.platform.platform_manager"
LOG_RECORDS = (
    (PLATFORM_LOGGER, logging.WARNING, re.compile(r"No supported accelerator detected\. Registered: .*\. "
                                                  r"Falling back to 'nvidia'\.\Z")),
    (PLATFORM_LOGGER, logging.WARNING, re.compile(r"Platform '[^']+' \(\w+\) is registered but not available\. "
                                                  r"This may be due to this ray actor being a CPU-only actor\.\Z")),
)


class KnownHarmless(logging.Filter):
    """Drops the records of ``LOG_RECORDS``; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, level, pattern in LOG_RECORDS:
            if record.name == name and record.levelno == level and pattern.match(record.getMessage()):
                return False
        return True


_FILTER = KnownHarmless()


def warning_options() -> tuple[str, ...]:
    """``WARNINGS`` as ``-W`` / ``PYTHONWARNINGS`` entries (the message is a literal prefix there, the module
    exact; neither may hold a colon or a comma)."""
    return tuple(f"ignore:{message}:{category.__name__}:{module}" for category, module, message in WARNINGS)


def child_env(env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """``env`` (default: this process's) plus what makes a child process as quiet: ``PYTHONWARNINGS`` with the
    entries added after any already there, and ``RECIPE_APO_QUIET=1``."""
    out = dict(os.environ if env is None else env)
    present = [entry for entry in out.get("PYTHONWARNINGS", "").split(",") if entry]
    out["PYTHONWARNINGS"] = ",".join(present + [e for e in warning_options() if e not in present])
    out[ENV] = "1"
    return out


def install() -> None:
    """Silence the known-harmless warnings in this process and in the processes it starts; idempotent."""
    for category, module, message in WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=category,
                                module=re.escape(module) + r"\Z")
    logger = logging.getLogger(PLATFORM_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    os.environ.update(child_env())


if os.environ.get(ENV) == "1":
    install()
