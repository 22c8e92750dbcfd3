"""The reward's worker process: math-verify in a process's main thread, where its signal-based timeouts work.

Started by ``recipe_apo.reward.pool`` as ``python -c <boot> <this file>``, loaded by path: it imports nothing
of the recipe (``import recipe_apo`` would import verl and torch: seconds and hundreds of MB per worker), so
this module needs the standard library alone, and math-verify. One JSON request per line on stdin, one JSON
reply per line on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Optional

MEMORY_ENV = "RECIPE_APO_REWARD_MEMORY_MB"
DEFAULT_MEMORY_MB = 4096


def _math_verify_inline(golds: list[str], pred: str, op_timeout: Optional[int]) -> float:
    """1.0 when math-verify finds ``pred`` equal to one of ``golds``. ``op_timeout``: math-verify's own
    per-operation timeout in whole seconds (signal based: only valid in a main thread), None for none."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    parsed_pred = parse("\\boxed{" + pred + "}", configs, parsing_timeout=op_timeout)
    if not parsed_pred:
        return 0.0
    for gold in golds:
        parsed_gold = parse("\\boxed{" + gold + "}", configs, parsing_timeout=op_timeout)
        if parsed_gold and verify(parsed_gold, parsed_pred, timeout_seconds=op_timeout):
            return 1.0
    return 0.0


def _worker_main() -> None:
    """Serve requests on stdin/stdout, one JSON object per line, until stdin closes."""
    import logging as _logging

    _logging.disable(_logging.CRITICAL)
    parent = int(os.environ.get("RECIPE_APO_REWARD_PARENT", "0") or 0)
    if parent and os.getppid() != parent:
        return
    # Leave when the parent is gone, even mid-computation (stdin's end-of-file only shows between requests).
    # Not PR_SET_PDEATHSIG: it fires when the parent THREAD exits, and verl's executor threads come and go.
    def watch_parent() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    if parent:
        threading.Thread(target=watch_parent, daemon=True).start()
    memory_mb = int(os.environ.get(MEMORY_ENV, "") or DEFAULT_MEMORY_MB)  # checked by the parent
    if memory_mb > 0:
        try:  # a runaway big-integer computation fails with MemoryError instead of swapping the node
            import resource

            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except Exception:
            pass
    # Replies get their own copy of stdout; anything a library prints goes to stderr and cannot break a reply.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        import math_verify  # noqa: F401

        out.write(json.dumps({"ready": True}) + "\n")
    except Exception as exc:  # reported to the parent, which falls back
        out.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        return
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            score = _math_verify_inline(request["golds"], request["pred"], request.get("op_timeout"))
            reply = {"score": score}
        except BaseException as exc:  # MemoryError, math-verify's TimeoutException, anything: a 0, not a crash
            reply = {"score": 0.0, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
