"""What verl imports where it builds a model (``actor_rollout_ref.model.external_lib``, which a preset of a method
with model classes of its own names): those classes, and the actor engine's choice of logits head per pass.

- **The classes**: every method's ``ModelParts.hf`` registration runs (R2PO's rollout-head classes, which transformers'
  ``AutoModelForCausalLM`` then picks by a checkpoint's ``architectures``). verl imports this module in each
  process that builds a model config: the actor and reference workers, the CPU rehearsal's ``hf`` engine.
- **The logits head**: a model with several logits heads (a ``select_logits_head`` context, R2PO's ``roll`` and
  ``base``) computes each pass of verl's FSDP engine with the head the trainer named for that pass
  (``verl_worker_access.HEAD_KEY`` in the batch's metadata, set by the recipe's trainer from the runtimes'
  ``actor_call``); with ``verl_worker_access.RESTART_KEY`` an update first restarts the optimizer's state, once per
  step that asks. verl 0.9.1 has no hand-off for either, so verl's ``FSDPEngineWithLMHead.forward_step`` is
  wrapped (``verl_worker_access.select_heads_in_forward``), in the processes that import this module only; a pass
  that names no head runs as verl runs it.
- **The head gap**: in an update pass that names a head, a model that can measure how far its heads are apart
  (``measuring_head_gap``, R2PO's) adds each micro-batch's measure to verl's metrics of the update
  (``actor/r2po_head_kl``, ...); only the update's metrics reach verl's trainer.
"""

from __future__ import annotations

from recipe_apo.integration.verl_worker_access import select_heads_in_forward
from recipe_apo.methods import catalog


def register_models() -> None:
    """Every method's model classes, registered with transformers (idempotent)."""
    for method in catalog.methods():
        for register in method.models.hf:
            register()


register_models()
select_heads_in_forward()
