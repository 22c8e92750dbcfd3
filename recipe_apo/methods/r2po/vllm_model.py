"""R2PO's model on vLLM's side: a family's vLLM class whose logits add the rollout head, z + delta (pi_roll, which
samples every rollout), and whose weight loading takes ``rollout_head.*`` (``model`` has the symbols). vLLM picks it
by the checkpoint's ``architectures`` (``R2POQwen2ForCausalLM`` ...), registered by the recipe's vLLM plugin
(``recipe_apo.integration.vllm_models``); verl's weight sync after each update hands it the actor's parameters
by their Hugging Face names, the head's among them. Imported in vLLM's processes only.
"""

from __future__ import annotations

import torch
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from recipe_apo.methods.r2po.model import RolloutHead


class _RolloutHeadLogits:
    """What a family's vLLM class gains (put first in the bases). The head is a plain torch module: vLLM's weight
    loader fills its parameters with its default loader, and a rollout engine runs one unsharded copy (the
    vocabulary dimension is not split across tensor-parallel ranks)."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config.get_text_config()
        self.rollout_head = RolloutHead(config.hidden_size, config.vocab_size)

    def compute_logits(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor | None:
        logits = super().compute_logits(hidden_states, *args, **kwargs)
        if logits is None:  # a pipeline stage without the output layer
            return None
        delta = self.rollout_head(hidden_states.to(self.rollout_head.layer1.weight.dtype))
        return logits + delta[..., : logits.shape[-1]].to(logits.dtype)


class R2POQwen2ForCausalLM(_RolloutHeadLogits, Qwen2ForCausalLM):
    pass


class R2POQwen3ForCausalLM(_RolloutHeadLogits, Qwen3ForCausalLM):
    pass


class R2POLlamaForCausalLM(_RolloutHeadLogits, LlamaForCausalLM):
    pass
