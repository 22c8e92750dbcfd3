"""A verl reward manager that scores a truncated response 0, as Dr. GRPO does: ``truncation=zero``.

verl hands a reward function the decoded text only, so the function cannot tell a response the length cap cut
off from one that ended; a cut response that happens to hold the right answer keeps its reward, which changes
the length incentive differently for each method. A reward manager sees the tokens. This one is verl's default
manager (``naive``) with one rule on top:

    a response whose valid length reaches the cap (``actor_rollout_ref.rollout.response_length``, which
    follows ``data.max_response_length``) and whose last token is not an end token (the tokenizer's eos or one
    of the model's ``generation_config`` eos ids, where vLLM stops) scores 0, whatever the function said.

Every score carries two extras into verl's reward info: ``truncated`` (1.0 or 0.0) and
``score_before_truncation``. They reach validation dumps and metrics; verl's V1 trainer writes no reward extras
into its training rollout dumps (the recipe's trainer adds its own ``truncated`` there, by the same rule).

Select it with ``truncation=zero`` in the recipe (``conf/truncation/zero.yaml``; the paper scripts do), or in
plain verl with::

    reward.reward_manager.source=importlib reward.reward_manager.name=TruncationAwareRewardManager \\
    reward.reward_manager.module.path=pkg://recipe_apo.reward.truncation
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

# The extras that hold the score itself (verl's naive manager writes ``acc``; dict rewards often ``score``).
_SCORE_KEYS = ("acc", "score")


def end_token_ids(tokenizer, generation_config=None) -> frozenset[int]:
    """Where generation stops: the tokenizer's eos and the model's generation_config eos ids (as vLLM stops)."""
    eos = getattr(generation_config, "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(eos if isinstance(eos, (list, tuple)) else [eos])}
    return frozenset(int(i) for i in ids if i is not None)


def generation_config_of(model_path: Optional[str]):
    """The model's generation_config, or None for a model without generation_config.json."""
    if not model_path:
        return None
    from transformers import GenerationConfig
    from verl.utils.fs import copy_to_local

    try:
        return GenerationConfig.from_pretrained(copy_to_local(model_path))
    except OSError:
        return None


def truncated_rows(responses: torch.Tensor, lengths: torch.Tensor, cap: int, end_ids: Iterable[int]) -> torch.Tensor:
    """Per row of right-padded ``responses`` (n, width) with ``lengths`` valid tokens: reached ``cap`` without
    ending in an end token."""
    lengths = lengths.to(torch.long)
    last = responses.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    ended = torch.isin(last, torch.tensor(sorted(end_ids), dtype=responses.dtype, device=responses.device))
    return (lengths >= cap) & ~ended


def is_truncated(response_ids: torch.Tensor, response_mask: torch.Tensor, cap: int, end_ids: Iterable[int]) -> bool:
    """One response of ``response_mask.sum()`` valid tokens reached ``cap`` without ending in an end token."""
    return bool(truncated_rows(response_ids.unsqueeze(0), response_mask.sum().reshape(1), cap, end_ids)[0])


class TruncationAwareRewardManager(NaiveRewardManager):
    """verl's naive reward manager, scoring 0 what the length cap cut off (module docstring)."""

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score, reward_router_address, reward_model_tokenizer)
        self.response_cap = int(config.actor_rollout_ref.rollout.response_length)
        self.end_ids = end_token_ids(tokenizer, generation_config_of(config.actor_rollout_ref.model.get("path")))

    async def run_single(self, data: DataProto) -> dict:
        result = await super().run_single(data)
        item = data[-1:][0]  # the naive manager scores the last sequence of a multi-sequence output
        responses = item.batch["responses"]
        mask = item.batch["attention_mask"][-responses.shape[-1]:]
        truncated = is_truncated(responses, mask, self.response_cap, self.end_ids)
        info = result["reward_extra_info"]
        info["score_before_truncation"] = result["reward_score"]
        info["truncated"] = 1.0 if truncated else 0.0
        if truncated:
            result["reward_score"] = 0.0
            for key in _SCORE_KEYS:
                if key in info:
                    info[key] = 0.0
        return result
