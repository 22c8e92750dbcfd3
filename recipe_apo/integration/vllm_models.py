"""The methods' vLLM model classes (``ModelParts.vllm``: R2PO's rollout-head classes), registered with vLLM's
``ModelRegistry`` in every process vLLM starts: the target of pyproject's ``vllm.general_plugins`` entry point
``recipe_apo_models``. vLLM then loads a checkpoint whose ``architectures`` names one of them with it. Registering a
name is lazy (``module:Class``): nothing is imported until a checkpoint asks for it. Imports neither verl nor
torch's models, so vLLM's processes start as fast as before."""

from __future__ import annotations

from recipe_apo.methods import catalog


def register_vllm_models() -> None:
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for method in catalog.methods():
        for architecture, spec in method.models.vllm.items():
            if architecture not in supported:
                ModelRegistry.register_model(architecture, spec)
