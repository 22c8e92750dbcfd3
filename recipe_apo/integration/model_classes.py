"""What verl imports where it builds a model (``actor_rollout_ref.model.external_lib``, which a preset of a method
with model classes of its own names): those classes, and the actor engine's choice of logits head per pass.

- **The classes**: every method's ``hf_models`` registration runs (R2PO's rollout-head classes, which transformers'
  ``AutoModelForCausalLM`` then picks by a checkpoint's ``architectures``). verl imports this module in each
  process that builds a model config: the actor and reference workers, the CPU rehearsal's ``hf`` engine.
- **The logits head**: a model with several logits heads (a ``select_logits_head`` context, R2PO's ``roll`` and
  ``base``) computes each pass of verl's FSDP engine with the head the trainer named for that pass
  (``verl_access.HEAD_KEY`` in the batch's metadata, set by the recipe's trainer from the runtimes'
  ``actor_call``); with ``verl_access.RESTART_KEY`` an update first restarts the optimizer's state, once per
  step that asks. verl 0.9.1 has no hand-off for either, so verl's ``FSDPEngineWithLMHead.forward_step`` is
  wrapped here, in the processes that import this module only; a pass that names no head runs as verl runs it.
- **The head gap**: in an update pass that names a head, a model that can measure how far its heads are apart
  (``measuring_head_gap``, R2PO's) adds each micro-batch's measure to verl's metrics of the update
  (``actor/r2po_head_kl``, ...); only the update's metrics reach verl's trainer.
"""

from __future__ import annotations

import contextlib
import functools

from recipe_apo.integration.verl_access import HEAD_KEY, RESTART_KEY
from recipe_apo.methods import catalog
from recipe_apo.methods.base import load


def register_models() -> None:
    """Every method's model classes, registered with transformers (idempotent)."""
    for method in catalog.methods():
        for spec in method.hf_models:
            load(spec)()


def _unwrapped(module):
    return getattr(module, "_fsdp_wrapped_module", module)  # FSDP1 wraps; FSDP2 keeps the model's own object


def _lengths(micro_batch):
    """Each sequence's prompt and response lengths, as verl's ``no_padding_2_padding`` reads them."""
    prompts, responses = micro_batch["prompts"], micro_batch["responses"]
    if prompts.is_nested:
        return prompts.offsets().diff(), responses.offsets().diff()
    mask = micro_batch["attention_mask"]
    return mask[:, : prompts.shape[1]].sum(dim=1), mask[:, prompts.shape[1]:].sum(dim=1)


def select_heads_in_forward() -> None:
    """verl's FSDP engine computes each pass with the logits head its batch names (the module's docstring)."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    original = FSDPEngineWithLMHead.forward_step
    if getattr(original, "_recipe_apo_heads", False):
        return
    FSDPEngineWithLMHead.forward_step = with_heads(original)


def with_heads(original):
    """``original`` (verl's ``forward_step``) with the head hand-off, the optimizer restart and the head gap."""
    from verl.utils import tensordict_utils as tu

    @functools.wraps(original)
    def forward_step(self, micro_batch, loss_function, forward_only):
        head = tu.get_non_tensor_data(micro_batch, HEAD_KEY, default=None)
        if head is None:
            return original(self, micro_batch, loss_function, forward_only)
        model = _unwrapped(self.module)
        select = getattr(model, "select_logits_head", None)
        if select is None:
            raise RuntimeError(f"the trainer asks for the logits head {head!r}, but the actor's model "
                               f"({type(model).__name__}) has one head only")
        restart = int(tu.get_non_tensor_data(micro_batch, RESTART_KEY, default=-1))
        if not forward_only and restart >= 0 and getattr(self, "_recipe_apo_restarted", None) != restart:
            self.optimizer.state.clear()  # Adam's moments and step count: as a fresh optimizer
            self._recipe_apo_restarted = restart
        measuring = None if forward_only else getattr(model, "measuring_head_gap", None)
        with select(head), (measuring() if measuring else contextlib.nullcontext()) as gap:
            loss, output = original(self, micro_batch, loss_function, forward_only)
            if gap is not None:
                output["metrics"].update(gap(*_lengths(micro_batch)))
        return loss, output

    forward_step._recipe_apo_heads = True
    return forward_step


register_models()
select_heads_in_forward()
