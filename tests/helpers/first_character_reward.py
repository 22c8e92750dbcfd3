"""A lenient grader for the tiny task (``recipe_apo.cpu.make_tiny``), for tests/vllm/test_agpo.py: a response is right
(1.0) when its answer, cut at ``<|im_end|>`` and stripped, starts with the ground truth's first character, else 0.0.

Why: AGPO's length bonus acts only in a group whose right answers differ in length. With the task's exact grader
(``recipe_apo.cpu.reward``) every right answer to a prompt is the same tokens, so the bonus never acts: a run of
tests/vllm/test_agpo.py had none in 3 steps, and sampling the tiny model at temperature 1, 1.5 and 2 (64 train
prompts, groups of 4 and 8) gave no group with one. With this grader at temperature 2, groups of 8: 68% of the
groups with both outcomes had a bonus (40% in groups of 4).

Standard library only: verl loads this file by path in its reward workers
(``reward.custom_reward_function.path=<this file>``).
"""

from __future__ import annotations

from typing import Any

END_TOKEN = "<|im_end|>"


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  **kwargs: Any) -> float:
    """1.0 if the answer starts with the ground truth's first character, else 0.0 (an empty answer is wrong)."""
    answer = solution_str.split(END_TOKEN, 1)[0].strip()
    truth = str(ground_truth).strip()
    return 1.0 if answer and truth and answer[0] == truth[0] else 0.0
