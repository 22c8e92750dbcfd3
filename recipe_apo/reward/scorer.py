"""Math answer reward: the last ``\\boxed{}`` of a response, checked against the ground truth with math-verify.

verl calls it as a custom reward function (``reward.custom_reward_function.path=pkg://recipe_apo.reward``,
``name=compute_score``) with ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` and
takes the float it returns as the response's reward (and as ``acc`` in the validation metrics).

Scoring, in order:

1. ``openai/gsm8k`` rows are left to verl's own GSM8K rule: verl's preprocessing asks for ``#### <answer>``
   there, not for a box, so its parquet files keep their meaning when this function is the reward.
2. reasoning-gym rows (``extra_info["reasoning_gym"]`` names the task: ``scripts/prepare_data.py --splits
   arithmetic``) are scored by their own rule, the last number checked by reasoning-gym's checker
   (``recipe_apo/reward/gym_answer.py``).
3. The answer is the content of the LAST ``\\boxed{...}`` or ``\\fbox{...}`` (balanced braces; ``\\boxed 5``
   too), as in Dr. GRPO's grader. No box, an unclosed last box, an empty one, one longer than
   ``MAX_ANSWER_CHARS`` or nested deeper than ``MAX_NESTING`` scores 0.
4. Answer and ground truths are normalized the way MATH-style graders do (percent signs dropped, ``1.5e7``
   read as ``1.5 \\times 10^{7}``, a boxed ground truth unboxed); an exact match scores 1 at once.
5. Otherwise math-verify decides (``parse`` + ``verify``, LaTeX and plain expressions), against
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

import logging
import re
from typing import Any, Iterable, Optional

from recipe_apo.reward import gym_answer
from recipe_apo.reward.pool import WorkerError, _pool, shutdown
from recipe_apo.reward.settings import DEFAULT_TIMEOUT_S, RewardConfigError, _number, env_settings

logger = logging.getLogger("recipe_apo.reward")

__all__ = ["DEFAULT_TIMEOUT_S", "RewardConfigError", "WorkerError", "compute_score", "last_boxed_answer",
           "normalize_answer", "score_answer", "score_many", "shutdown"]

# Longer than any real final answer (Minerva's longest formulas are ~150 characters); bounds the brace scan
# and keeps megabytes of text away from the LaTeX parser.
MAX_ANSWER_CHARS = 1000
# Real answers nest a few levels; hundreds of levels make latex2sympy take seconds per parse.
MAX_NESTING = 24

# verl's own preprocessing of these sources asks for an answer format other than a box.
VERL_RULE_SOURCES = frozenset({"openai/gsm8k"})

_WARNED: set[str] = set()


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
        raise RewardConfigError(
            f"reward.custom_reward_function.reward_kwargs.timeout={kwargs['timeout']!r} must be > 0")
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
        if gym_answer.is_gym_row(extra_info):
            return gym_answer.score(solution_str, ground_truth, extra_info)
        return score_answer(last_boxed_answer(solution_str), _ground_truths(ground_truth, extra_info),
                            _timeout_from(kwargs))
    except (RewardConfigError, WorkerError, gym_answer.GymRewardError):
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
