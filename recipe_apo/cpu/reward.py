"""Exact-match reward for the CPU rehearsal's toy task (the parquet files ``recipe_apo.cpu.make_tiny`` writes).

The task has two data sources, both answered by a short string:

- ``tiny_add``: ``"3+4="`` -> ``"7"`` (single-digit sums);
- ``tiny_reverse``: ``"reverse\\nabc"`` -> ``"cba"`` (2-4 letters, reversed).

A response scores 1.0 when its text, with surrounding whitespace stripped and cut at a leftover ``<|im_end|>``,
equals the ground truth, else 0.0. verl's naive reward manager decodes with ``skip_special_tokens=True``, so
the end token is normally gone already; the cut covers a decode that keeps special tokens.

Select it in verl 0.9.1 (the ``reward.custom_reward_function`` group; ``name`` defaults to ``compute_score``)::

    reward.custom_reward_function.path=pkg://recipe_apo.cpu.reward reward.custom_reward_function.name=compute_score

or with the file's path (``path=/abs/path/to/recipe_apo/cpu/reward.py``; ``make_tiny`` returns it). verl's
``load_extern_object`` imports a ``pkg://`` path as a module and executes a plain path as a file, so either
works wherever ``recipe_apo`` is installed; the file path works without that. verl's
``migrate_legacy_reward_impl`` also copies the legacy top-level ``custom_reward_function.*`` keys there, but
the ``reward.`` form is the one verl's own ``reward/reward.yaml`` declares.

Standard library only: verl loads this module by path inside its reward workers.
"""

from __future__ import annotations

from typing import Any

#: The data sources this reward knows; ``make_tiny`` writes exactly these.
DATA_SOURCES = frozenset({"tiny_add", "tiny_reverse"})

END_TOKEN = "<|im_end|>"


def extract_answer(solution_str: str) -> str:
    """The response's answer: the text before any ``<|im_end|>``, surrounding whitespace stripped."""
    return solution_str.split(END_TOKEN, 1)[0].strip()


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **kwargs: Any
) -> float:
    """1.0 if the response's answer equals ``ground_truth`` exactly, else 0.0.

    ``extra_info`` and ``**kwargs`` (verl passes e.g. ``reward_router_address``) are accepted and ignored.
    Raises ValueError for a ``data_source`` this task does not have, so a wrong dataset fails loudly instead
    of training on all-zero rewards.
    """
    if data_source not in DATA_SOURCES:
        raise ValueError(
            f"recipe_apo.cpu.reward: unknown data_source {data_source!r} (expected one of {sorted(DATA_SOURCES)})"
        )
    return 1.0 if extract_answer(solution_str) == str(ground_truth).strip() else 0.0
