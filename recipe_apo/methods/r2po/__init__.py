"""R2PO (arXiv 2601.11960) as its authors' code builds it (RRPO-ARR/Code at 8a2cc4d, ``simple_grpo_v1/``):
``method=r2po``. A residual rollout head explores; the policy learns from what it finds.

- ``model`` / ``vllm_model``: the causal LM with the rollout head, pi_roll = softmax(z + delta) samples every
  rollout, pi_base = softmax(z) is the model users keep;
- ``schedule``: rounds of a head phase (``head_steps``) then a policy phase (``policy_steps``);
- ``estimator``: ``rarity`` (head phase) and GRPO with the range skip (policy phase), ``r2po`` picking the phase's;
- ``settings``: ``algorithm.r2po``; ``launch``: what the launch refuses;
- ``runtime``: the phase of each step for the estimator and for the policy's passes (which logits head, when the
  optimizer restarts), and ``r2po/*`` metrics.

How far pi_roll is from pi_base is measured where both logits are, in the model's forward during the actor's
update (``model.measuring_head_gap``), and logged as verl logs a worker's metrics of the update: ``actor/r2po_head_kl``
(the mean over response tokens of KL(pi_roll || pi_base), nats) and ``actor/r2po_head_logit_gap`` (the mean over
response tokens of the residual's range max_v delta - min_v delta, which bounds |log pi_roll - log pi_base| of every
token). They are not in ``metrics`` below, the runtime's, which the testbed records each round (its policy has no
such pass).

Its preset (``conf/method/r2po.yaml``) takes the released script's settings: PPO clip 0.2, the per-response token
mean, the k3 KL to the original model with beta 0.04, no importance correction, and its head's effective start
(N(0, 0.02^2)). What the source trains with beside its schedule (its reward, temperature, end token and step) is
declared with the schedule, in ``settings``. docs/beside_apo.md states each
departure from the released code and which of its defects are fixed.
"""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.base import Method, Metric, ModelParts, setting
from recipe_apo.methods.r2po.model import model_for_run, new_rollout_head, register_hf_models
from recipe_apo.methods.r2po.settings import R2poSettings

# verl imports this module where it builds a model (actor_rollout_ref.model.external_lib, set by the preset): the
# methods' model classes, and the actor engine's choice of logits head per pass.
EXTERNAL_LIB = "recipe_apo.integration.model_classes"
# Its vLLM model classes by architecture, as vLLM's registry takes them: lazily, so that vLLM's processes import
# none (nor vLLM's models they build on) until a checkpoint names one.
VLLM_MODELS = {name: f"recipe_apo.methods.r2po.vllm_model:{name}"
               for name in ("R2POQwen2ForCausalLM", "R2POQwen3ForCausalLM", "R2POLlamaForCausalLM")}


def uses_r2po(config: Any) -> bool:
    """A run of ``config`` trains R2PO's two heads in phases."""
    return str(setting(config, "algorithm.adv_estimator")) == "r2po"


METHOD = Method(
    name="r2po",
    title="R2PO",
    active=uses_r2po,
    presets=("r2po",),
    settings=R2poSettings,
    models=ModelParts(hf=(register_hf_models,), vllm=VLLM_MODELS, prepare=model_for_run,
                      policy_head=new_rollout_head),
    order=5,
    metrics={
        "phase": Metric("the step's phase: 0 head (only rollout_head.* trains, on the rarity advantage), 1 policy",
                        headline=True),
        "round": "the step's round of the schedule (a head phase then a policy phase), from 0",
        "rarity_skipped_share": "head steps: share of responses in groups whose rarity scores are all equal (A = 0)",
        "range_skipped_share": "policy steps: share of responses in groups whose rewards span less than 0.01 (A = 0)",
    },
)

# Its parts declare themselves into METHOD where they are defined (``@METHOD.estimator(...)``, ...).
from recipe_apo.methods.r2po import estimator, launch, runtime  # noqa: E402, F401
