"""A kept path: ``reward.reward_manager.module.path=pkg://recipe_apo.reward_manager`` (``truncation=zero``).

The truncation-aware reward manager lives in ``recipe_apo.reward.truncation``; this module only keeps the old
path working.
"""

from recipe_apo.reward.truncation import (
    TruncationAwareRewardManager,
    end_token_ids,
    generation_config_of,
    is_truncated,
    truncated_rows,
)

__all__ = ["TruncationAwareRewardManager", "end_token_ids", "generation_config_of", "is_truncated", "truncated_rows"]
