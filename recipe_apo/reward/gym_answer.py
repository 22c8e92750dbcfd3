"""The reward of reasoning-gym rows (``scripts/prepare_data.py --splits arithmetic``): the response's last number,
checked by reasoning-gym's own checker of the row's task.

A row is a reasoning-gym row when its ``extra_info`` names the generator (``extra_info["reasoning_gym"]``, e.g.
``basic_arithmetic``); ``recipe_apo.reward.compute_score`` sends such rows here, whatever their ``data_source``.

Extraction rule: the answer is the LAST number in the response, an optional minus sign, digits, and an optional
decimal part (``-?\\d+(\\.\\d+)?``), after removing the commas between digit groups (``1,234`` -> ``1234``). No box
or other format is asked for, so no reward comes from format alone: a response scores 1 only when that number is
the right answer. Why the last number: the base model writes its result in plain text ("1 + 5 = 6") and boxes
nothing (0 of 128 samples asked for ``\\boxed{}``), so a box rule would leave every group without signal.

Check: ``reasoning_gym.get_score_answer_fn(<generator>)(answer, {"answer": ground_truth, "metadata": ...})``, the
task's own checker; a response scores 1.0 only when the checker gives full credit (1.0), else 0.0. Full credit
only, because reasoning-gym's default checker gives partial credit to an answer that contains the right one
(``"16"`` against ``"6"`` scores 0.5): a wrong number must not be paid.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable, Optional

# The generator's name in a row's extra_info: what makes a row a reasoning-gym row.
GYM_KEY = "reasoning_gym"
# The generator's per-row metadata (JSON text), which some checkers read.
METADATA_KEY = "reasoning_gym_metadata"

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_DIGIT_GROUPS = re.compile(r"(?<=\d),(?=\d{3}\b)")


class GymRewardError(RuntimeError):
    """reasoning-gym is missing where its rows are scored; the message says what to install."""


def last_number(text: str) -> Optional[str]:
    """The last number of ``text`` (the extraction rule above), or None when it holds none."""
    found = _NUMBER.findall(_DIGIT_GROUPS.sub("", text))
    return found[-1] if found else None


@functools.lru_cache(maxsize=None)
def _checker(generator: str) -> Callable[[Optional[str], dict], float]:
    try:
        import reasoning_gym
    except ImportError:
        raise GymRewardError(f"a reasoning-gym row ({GYM_KEY}={generator}) is scored with reasoning-gym's checker, "
                             'which is not installed: pip install -e ".[real]"') from None
    return reasoning_gym.get_score_answer_fn(generator)


def is_gym_row(extra_info: Any) -> bool:
    return isinstance(extra_info, dict) and isinstance(extra_info.get(GYM_KEY), str)


def score(solution_str: str, ground_truth: Any, extra_info: dict) -> float:
    """1.0 when the response's last number gets full credit from the task's checker, else 0.0."""
    answer = last_number(solution_str)
    if answer is None:
        return 0.0
    metadata = extra_info.get(METADATA_KEY)
    entry = {"answer": str(ground_truth), "metadata": json.loads(metadata) if isinstance(metadata, str) else {}}
    return 1.0 if _checker(extra_info[GYM_KEY])(answer, entry) == 1.0 else 0.0
