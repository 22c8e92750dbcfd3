"""The recipe's rewards.

- ``scorer``: the math answer reward verl calls (``reward.custom_reward_function.path=pkg://recipe_apo.reward``,
  ``name=compute_score``), math-verify behind a pool of worker processes with a time bound;
- ``truncation``: verl's naive reward manager plus Dr. GRPO's rule that a truncated response scores 0
  (``truncation=zero``).
"""

from recipe_apo.reward.scorer import (
    DEFAULT_TIMEOUT_S,
    RewardConfigError,
    WorkerError,
    compute_score,
    last_boxed_answer,
    normalize_answer,
    score_answer,
    score_many,
    shutdown,
)

__all__ = ["DEFAULT_TIMEOUT_S", "RewardConfigError", "WorkerError", "compute_score", "last_boxed_answer",
           "normalize_answer", "score_answer", "score_many", "shutdown"]
