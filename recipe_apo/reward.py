"""Math answer reward: the last ``\\boxed{}`` of a response, checked against the ground truth with math-verify.

verl calls it as a custom reward function (``reward.custom_reward_function.path=pkg://recipe_apo.reward``,
``name=compute_score``) with ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` and
takes the float it returns as the response's reward (and as ``acc`` in the validation metrics).

Scoring, in order:

1. ``openai/gsm8k`` rows are left to verl's own GSM8K rule: verl's preprocessing asks for ``#### <answer>``
   there, not for a box, so its parquet files keep their meaning when this function is the reward.
2. The answer is the content of the LAST ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces; ``\\boxed 5``
   too), as in Dr. GRPO's grader. No box, an unclosed last box, an empty one, one longer than
   ``MAX_ANSWER_CHARS`` or nested deeper than ``MAX_NESTING`` scores 0.
3. Answer and ground truths are normalized the way MATH-style graders do (percent signs dropped, ``1.5e7``
   read as ``1.5 \\times 10^{7}``, a boxed ground truth unboxed); an exact match scores 1 at once.
4. Otherwise math-verify decides (``parse`` + ``verify``, LaTeX and plain expressions), against
   ``ground_truth`` and any alternatives in ``extra_info["answers"]``.

Why worker processes: math-verify's timeouts use ``signal.alarm``, which works only in a process's main
thread, and verl calls reward functions from executor threads; there math-verify either refuses (a timeout set)
or runs unbounded (none set), and sympy then spends minutes on ``10^{10^{10}}`` or ``(10^8)!``. So math-verify
runs in a few long-lived worker processes (plain ``subprocess``, one JSON line per request), in their main
thread, where its own timeouts (a third of ``timeout`` each) end such answers in about a second. A signal
handler cannot interrupt one long C call, so the caller also enforces ``timeout`` itself: a worker that
overruns it is killed and replaced, and the response scores 0.

What ``timeout`` bounds: the check of one answer, from the moment a worker takes it to its score. A call
first waits for a free worker (``RECIPE_APO_REWARD_WORKERS`` of them serve all threads of a process); with
every worker busy on answers that each run to the timeout, a call waits for them in turn. The first call of a
process also starts the workers (a few seconds).

``compute_score`` never raises on an answer: anything unexpected in a response or ground truth scores 0 (logged
once per kind of failure). It raises on what would make every score wrong: a bad environment value
(``RewardConfigError``, naming the variable) or workers that cannot start (``WorkerError``); checking answers in
the calling thread instead would run math-verify without any time bound, and a single hostile answer could
then hang training.

Environment: ``RECIPE_APO_REWARD_TIMEOUT`` (seconds > 0, default 10), ``RECIPE_APO_REWARD_WORKERS`` (an integer
>= 1; default ``min(4, cpu count)``), ``RECIPE_APO_REWARD_MEMORY_MB`` (address-space cap per worker, an integer
>= 0, default 4096; 0 = none). ``timeout`` can also come from ``reward_kwargs``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from typing import Any, Iterable, Optional

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0
# Longer than any real final answer (Minerva's longest formulas are ~150 characters); bounds the brace scan
# and keeps megabytes of text away from the LaTeX parser.
MAX_ANSWER_CHARS = 1000
# Real answers nest a few levels; hundreds of levels make latex2sympy take seconds per parse.
MAX_NESTING = 24
# Worker start-up (interpreter + sympy import) does not count against a request's timeout.
WORKER_START_TIMEOUT_S = 120.0

# verl's own preprocessing of these sources asks for an answer format other than a box.
VERL_RULE_SOURCES = frozenset({"openai/gsm8k"})

_WARNED: set[str] = set()

TIMEOUT_ENV = "RECIPE_APO_REWARD_TIMEOUT"
WORKERS_ENV = "RECIPE_APO_REWARD_WORKERS"
MEMORY_ENV = "RECIPE_APO_REWARD_MEMORY_MB"
DEFAULT_MEMORY_MB = 4096


class RewardConfigError(ValueError):
    """A setting of the reward (environment variable or ``reward_kwargs``) is invalid; the message names it."""


def _number(name: str, raw: Any, integer: bool, minimum: float) -> float:
    """``raw`` as a finite number >= ``minimum`` (an integer when ``integer``), or RewardConfigError naming ``name``."""
    kind = "an integer" if integer else "a number"
    try:
        value = int(raw) if integer and not isinstance(raw, float) else float(raw)
    except (TypeError, ValueError):
        value = None
    if isinstance(raw, bool) or value is None or value != value or value in (float("inf"), float("-inf")) \
            or value < minimum:
        raise RewardConfigError(f"{name}={raw!r} must be {kind} >= {minimum:g}")
    return value


def _env_number(name: str, default: float, integer: bool, minimum: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    return _number(name, raw.strip(), integer, minimum)


def env_settings() -> dict[str, float]:
    """The reward's environment settings, checked: ``timeout`` (s), ``workers``, ``memory_mb``."""
    timeout = _env_number(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, integer=False, minimum=0.0)
    if timeout <= 0:
        raise RewardConfigError(f"{TIMEOUT_ENV}={os.environ[TIMEOUT_ENV]!r} must be a number > 0")
    return {
        "timeout": timeout,
        "workers": int(_env_number(WORKERS_ENV, min(4, os.cpu_count() or 1), integer=True, minimum=1)),
        "memory_mb": int(_env_number(MEMORY_ENV, DEFAULT_MEMORY_MB, integer=True, minimum=0)),
    }


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(message, *args)


# --------------------------------------------------------------------------------------------------------------
# Answer extraction and normalization (pure string work, linear in the input)
# --------------------------------------------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_answer(text: str, max_chars: int = MAX_ANSWER_CHARS) -> Optional[str]:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, or None.

    The last command decides even when it is unclosed (a response cut off inside its final box has no final
    answer), as in Dr. GRPO's and Hendrycks' MATH graders. ``\\boxed 5`` (no braces) yields ``5``.
    """
    if not isinstance(text, str):
        return None
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    pos = start + len(command)
    n = len(text)
    while pos < n and text[pos] == " ":
        pos += 1
    if pos >= n:
        return None
    if text[pos] == "{":
        depth = 0
        stop = min(n, pos + max_chars + 2)
        for i in range(pos, stop):
            char = text[i]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[pos + 1 : i]
        return None
    if pos == start + len(command):
        return None  # "\boxedfoo": another command, not a box
    match = re.match(r"[^\s$]{1,%d}" % max_chars, text[pos : pos + max_chars + 1])
    return match.group(0) if match else None


_SCI_NUMBER = re.compile(r"^([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)[eE]([+-]?\d+)$")
_TRAILING_PUNCT = re.compile(r"[\s.]+$")


def normalize_answer(answer: Any) -> str:
    """A ground truth or extracted answer as a string math-verify reads the way MATH graders intend.

    - numbers (AMC's ground truths are floats such as ``142.0``) become their shortest string;
    - a ground truth that is a whole solution becomes its last boxed answer;
    - percent signs are dropped, so ``50\\%``, ``50%`` and ``50`` agree (MATH's convention; ``0.5`` does not);
    - ``8.7e8`` becomes ``8.7 \\times 10^{8}`` (math-verify reads the ``e`` as Euler's number);
    - surrounding ``$``, whitespace and a final period go.
    """
    if answer is None:
        return ""
    if isinstance(answer, bool):
        return ""
    if isinstance(answer, float):
        answer = str(int(answer)) if answer.is_integer() else repr(answer)
    elif not isinstance(answer, str):
        answer = str(answer)
    text = answer.strip()
    if "\\boxed" in text or "\\fbox" in text:
        boxed = last_boxed_answer(text)
        text = boxed.strip() if boxed is not None else text
    text = text.replace("\\%", "").replace("%", "")
    text = _TRAILING_PUNCT.sub("", text.strip()).strip("$").strip()
    text = _TRAILING_PUNCT.sub("", text)
    match = _SCI_NUMBER.match(text)
    if match:
        text = f"{match.group(1)} \\times 10^{{{int(match.group(2))}}}"
    return text


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "{([":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif char in "})]" and depth > 0:
            depth -= 1
    return deepest


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _ground_truths(ground_truth: Any, extra_info: Any) -> list[str]:
    """The ground truth plus alternatives (Minerva and OlympiadBench list several forms of some answers)."""
    candidates: list[Any] = []
    if isinstance(ground_truth, (list, tuple)) or _is_array(ground_truth):
        candidates.extend(list(ground_truth))
    else:
        candidates.append(ground_truth)
    if isinstance(extra_info, dict):
        answers = extra_info.get("answers")
        if isinstance(answers, (list, tuple)) or _is_array(answers):
            candidates.extend(list(answers))
    seen: list[str] = []
    for candidate in candidates:
        normalized = normalize_answer(candidate)
        if normalized and normalized not in seen:
            seen.append(normalized)
    return seen


def _is_array(value: Any) -> bool:
    # numpy arrays come out of parquet list columns; no numpy import needed to recognise them.
    return type(value).__name__ == "ndarray" and hasattr(value, "tolist")


# --------------------------------------------------------------------------------------------------------------
# math-verify, as run inside a worker (or inline as the fallback)
# --------------------------------------------------------------------------------------------------------------


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


def _op_timeout(timeout: float) -> int:
    # Three signal-timed operations share one request's budget: parse the answer, parse a gold, verify.
    return max(1, int(timeout // 3))


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


# --------------------------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------------------------

# Loads this file by path (not `import recipe_apo`, which imports verl and torch: seconds and hundreds of MB
# per worker) and serves. The working directory is dropped from sys.path so that nothing in the caller's
# working directory shadows a library.
_WORKER_BOOT = (
    "import sys, importlib.util\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
    "spec = importlib.util.spec_from_file_location('_recipe_apo_reward_worker', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module._worker_main()\n"
)


class WorkerError(RuntimeError):
    """A worker could not be started or answered nothing usable."""


class _Worker:
    def __init__(self, memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        env = dict(os.environ)
        env["RECIPE_APO_REWARD_PARENT"] = str(os.getpid())
        env[MEMORY_ENV] = str(memory_mb)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            # Its own session: a Ctrl-C in the terminal reaches the trainer, which then closes the worker.
            start_new_session=True,
        )
        self._buffer = b""
        reply = self._read_line(WORKER_START_TIMEOUT_S)
        if reply is None or not reply.get("ready"):
            error = (reply or {}).get("error", "no answer")
            self.kill()
            raise WorkerError(f"reward worker did not start: {error}")

    def _read_line(self, timeout: float) -> Optional[dict]:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # the worker died
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return None

    def request(self, golds: list[str], pred: str, timeout: float, op_timeout: Optional[int] = None) -> Optional[float]:
        """The score, or None when the worker overran ``timeout`` or died (the caller then kills it).
        ``op_timeout``: math-verify's own per-operation limit inside the worker (default: a third of ``timeout``)."""
        op_timeout = _op_timeout(timeout) if op_timeout is None else op_timeout
        message = json.dumps({"golds": golds, "pred": pred, "op_timeout": op_timeout}) + "\n"
        try:
            self.proc.stdin.write(message.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return None
        reply = self._read_line(timeout)
        if reply is None:
            return None
        return float(reply.get("score", 0.0))

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except Exception:
                pass


class VerifierPool:
    """Up to ``size`` workers shared by all threads of this process; started on first use."""

    def __init__(self, size: int, memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        self.size = max(1, size)
        self.memory_mb = memory_mb
        # The longest check of one answer so far (what ``timeout`` bounds), for tests and benchmarks.
        self.longest_check_s = 0.0
        self._start_error: Optional[WorkerError] = None
        self.pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.size)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self.start_failures = 0
        self.kills = 0

    def score(self, golds: list[str], pred: str, timeout: float, op_timeout: Optional[int] = None) -> float:
        with self._slots:
            worker = self._take()
            started = time.monotonic()
            result = worker.request(golds, pred, timeout, op_timeout)
            self.longest_check_s = max(self.longest_check_s, time.monotonic() - started)
            if result is None:
                self._discard(worker)
                self.kills += 1
                logger.info("reward worker overran %.1fs on an answer of %d chars; replaced", timeout, len(pred))
                return 0.0
            with self._lock:
                self._idle.append(worker)
            return result

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                self._all.discard(worker)
        if self._start_error is not None:
            raise self._start_error  # once failed, not retried on every call (each try can take minutes)
        try:
            worker = _Worker(self.memory_mb)
        except WorkerError as exc:
            self.start_failures += 1
            self._start_error = WorkerError(
                f"recipe_apo.reward: {exc}; math-verify cannot run with its time bound, so answers are not scored "
                f"(check that subprocesses can start and math-verify imports; {MEMORY_ENV} too small?)"
            )
            raise self._start_error from None
        with self._lock:
            self._all.add(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._idle = list(self._all), set(), []
        if os.getpid() != self.pid:
            return  # inherited through fork: the workers belong to the parent
        for worker in workers:
            worker.kill()


_POOL: Optional[VerifierPool] = None
_POOL_LOCK = threading.Lock()


def _pool() -> VerifierPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():  # a forked child starts its own workers
            settings = env_settings()
            _POOL = VerifierPool(int(settings["workers"]), int(settings["memory_mb"]))
        return _POOL


def shutdown() -> None:
    """Stop this process's reward workers (they also stop with the process)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


atexit.register(shutdown)
# A bad environment value stops the run when verl loads this reward, not at the first answer.
env_settings()


def _verify(golds: list[str], pred: str, timeout: float) -> float:
    return _pool().score(golds, pred, timeout)


# --------------------------------------------------------------------------------------------------------------
# verl's entry point
# --------------------------------------------------------------------------------------------------------------


def score_answer(answer: Optional[str], golds: list[str], timeout: float = DEFAULT_TIMEOUT_S) -> float:
    """Score an extracted answer against normalized ground truths (see the module docstring)."""
    if answer is None or not golds:
        return 0.0
    pred = normalize_answer(answer)
    if not pred or len(pred) > MAX_ANSWER_CHARS or _nesting_depth(pred) > MAX_NESTING:
        return 0.0
    squashed = _squash(pred)
    if any(_squash(gold) == squashed for gold in golds):
        return 1.0
    golds = [gold for gold in golds if len(gold) <= MAX_ANSWER_CHARS and _nesting_depth(gold) <= MAX_NESTING]
    if not golds:
        return 0.0
    return _verify(golds, pred, timeout)


def _timeout_from(kwargs: dict) -> float:
    if "timeout" not in kwargs:
        return env_settings()["timeout"]
    value = _number("reward.custom_reward_function.reward_kwargs.timeout", kwargs["timeout"], False, 0.0)
    if value <= 0:
        raise RewardConfigError(f"reward.custom_reward_function.reward_kwargs.timeout={kwargs['timeout']!r} must be > 0")
    return value


def _verl_rule_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> float:
    from verl.utils.reward_score import default_compute_score

    result = default_compute_score(data_source, solution_str, ground_truth, extra_info)
    if isinstance(result, dict):
        result = result.get("score", 0.0)
    return float(result)


def compute_score(
    data_source: Any,
    solution_str: Any,
    ground_truth: Any,
    extra_info: Optional[dict] = None,
    **kwargs: Any,
) -> float:
    """verl's custom reward: 1.0 when the response's last boxed answer equals the ground truth, else 0.0."""
    try:
        if not isinstance(solution_str, str) or not solution_str:
            return 0.0
        if data_source in VERL_RULE_SOURCES:
            return _verl_rule_score(data_source, solution_str, ground_truth, extra_info)
        return score_answer(last_boxed_answer(solution_str), _ground_truths(ground_truth, extra_info),
                            _timeout_from(kwargs))
    except (RewardConfigError, WorkerError):
        raise  # every score would be wrong: stop, naming the cause
    except Exception as exc:  # an answer must never take a training step down
        _warn_once(f"error:{type(exc).__name__}", "recipe_apo.reward: %s: %s; scored 0", type(exc).__name__, exc)
        return 0.0


def score_many(items: Iterable[tuple[Any, str, Any, Optional[dict]]], timeout: float = DEFAULT_TIMEOUT_S,
               threads: Optional[int] = None) -> list[float]:
    """``compute_score`` over ``(data_source, solution_str, ground_truth, extra_info)`` items, in order, with
    as many threads as there are workers (for offline evaluation)."""
    from concurrent.futures import ThreadPoolExecutor

    items = list(items)
    threads = threads or _pool().size
    with ThreadPoolExecutor(max_workers=threads) as executor:
        return list(executor.map(lambda item: compute_score(*item, timeout=timeout), items))
