"""What the launch refuses of an R2PO run, before Ray starts (each check takes a ``Launch``; a refusal is one
``MethodConfigError`` line naming the key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recipe_apo.methods.base import Launch, setting
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.r2po import EXTERNAL_LIB, uses_r2po

# verl's rollout correction: any of these on adds an importance weight (or rejection) between the sampler and the
# learner, which the source has none of.
CORRECTIONS = ("rollout_is", "rollout_rs")
ENGINES = ("vllm", "hf")        # rollout engines with a rollout-head model (vLLM's class; the rehearsal's hf)
# The actor engine whose forward the recipe hands the logits head, and that shards each parameter alone: FSDP1
# (verl's "fsdp", use_orig_params=false by default) flattens the head with the policy's parameters, so a phase's
# idle ones get zero gradients instead of none, and AdamW's weight decay moves them.
STRATEGIES = ("fsdp2",)


def check_launch(launch: Launch) -> None:
    """Refuses what would make an R2PO run other than R2PO: a model without a rollout head, verl's rollout
    correction, kernels or engines that skip the model's output layer, and verl's asynchronous modes (a rollout
    that spans a phase switch samples from the other phase's policy)."""
    config = launch.config
    if not uses_r2po(config):
        return
    check_model(config)
    correction = setting(config, "algorithm.rollout_correction") or {}
    for key in CORRECTIONS:
        if correction.get(key) is not None:
            raise MethodConfigError(
                f"algorithm.rollout_correction.{key}={correction.get(key)} with algorithm.adv_estimator=r2po: R2PO's "
                "policy phase learns pi_base on pi_roll's samples with no importance correction (as its source); "
                f"set algorithm.rollout_correction.{key}=null")
    if correction.get("bypass_mode", False):
        raise MethodConfigError(
            "algorithm.rollout_correction.bypass_mode=true with algorithm.adv_estimator=r2po: the old log-probs would "
            "be the rollout's (pi_roll), where R2PO's policy phase takes them from pi_base; set it to false")
    if launch.asynchronous:
        raise MethodConfigError(
            f"trainer.v1.trainer_mode={launch.verl_mode} with algorithm.adv_estimator=r2po: a rollout of an "
            "asynchronous mode spans weight updates, so at a phase switch it samples from the other phase's head; "
            "run R2PO in sync mode")
    for key in ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.fsdp_config.strategy"):
        strategy = str(setting(config, key, "fsdp"))
        if strategy not in STRATEGIES:
            raise MethodConfigError(
                f"{key}={strategy} with algorithm.adv_estimator=r2po: each phase trains part of the model, and only "
                "FSDP2 (per-parameter shards) leaves the idle part without gradients, so that AdamW's weight decay "
                f"does not move it; set {key}=fsdp2 (the r2po preset does)")
    engine = str(setting(config, "actor_rollout_ref.rollout.name", "vllm"))
    if engine not in ENGINES:
        raise MethodConfigError(f"actor_rollout_ref.rollout.name={engine} with algorithm.adv_estimator=r2po: no "
                                f"rollout-head model for that engine; use one of {', '.join(ENGINES)}")
    model = setting(config, "actor_rollout_ref.model") or {}
    for key in ("use_fused_kernels", "use_liger"):
        if model.get(key, False):
            raise MethodConfigError(
                f"actor_rollout_ref.model.{key}=true with algorithm.adv_estimator=r2po: those kernels compute the "
                "log-probs without the model's output layer, where the rollout head adds its residual; set it false")
    if int((model.get("lora") or {}).get("rank", 0) or model.get("lora_rank", 0) or 0) > 0:
        raise MethodConfigError("actor_rollout_ref.model.lora_rank > 0 with algorithm.adv_estimator=r2po: R2PO trains "
                                "the whole model in its policy phase; set lora_rank=0")


def check_model(config: Any) -> None:
    """verl must import the recipe's model classes where it builds a model (``actor_rollout_ref.model.external_lib``),
    and the model must carry a rollout head or be a local folder (the launch then trains a copy with one, made in
    the run's checkpoint folder: ``recipe_apo.main``)."""
    lib = setting(config, "actor_rollout_ref.model.external_lib")
    if lib != EXTERNAL_LIB:
        raise MethodConfigError(
            f"actor_rollout_ref.model.external_lib={lib} with algorithm.adv_estimator=r2po: verl must import "
            f"{EXTERNAL_LIB} where it builds the model (the rollout-head classes); the r2po preset sets it")
    path = setting(config, "actor_rollout_ref.model.path")
    folder = Path(str(path)).expanduser()
    if not folder.is_dir():
        raise MethodConfigError(
            f"actor_rollout_ref.model.path={path} with algorithm.adv_estimator=r2po: R2PO trains a rollout head "
            "beside the policy, added to a local copy of the model; download the model and give its folder, or "
            f"make the copy yourself: python scripts/r2po_head.py add <model folder> <folder>")
    try:
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise MethodConfigError(f"actor_rollout_ref.model.path={path}: no readable config.json ({exc})") from exc
