"""What the launch refuses of an R2PO run, before Ray starts (each check takes a ``Launch``; a refusal is one
``MethodConfigError`` line naming the key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipe_apo.methods.base import Launch, setting
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.r2po import EXTERNAL_LIB, METHOD, uses_r2po

# verl's rollout correction: any of these on adds an importance weight (or rejection) between the sampler and the
# learner, which the source has none of.
CORRECTIONS = ("rollout_is", "rollout_rs")
ENGINES = ("vllm", "hf")        # rollout engines with a rollout-head model (vLLM's class; the rehearsal's hf)
# The actor engine whose forward the recipe hands the logits head, and that shards each parameter alone: FSDP1
# (verl's "fsdp", use_orig_params=false by default) flattens the head with the policy's parameters, so a phase's
# idle ones get zero gradients instead of none, and AdamW's weight decay moves them.
STRATEGIES = ("fsdp2",)


@METHOD.launch_check
def check_launch(launch: Launch) -> None:
    """Refuses what would make an R2PO run other than R2PO: a model without a rollout head, verl's rollout
    correction, kernels or engines that skip the model's output layer, verl's asynchronous modes (a rollout
    that spans a phase switch samples from the other phase's policy), a KL penalty in the reward (it empties the
    rarity signal), advantages not divided by the group's std (the source always divides) and LoRA."""
    config = launch.config
    if not uses_r2po(config):
        return
    check_model(config, local_copy=not launch.testbed)
    check_advantage(config)
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
    if launch.asynchronous or launch.staleness:
        # The testbed's stale rounds sample from the policy of rounds before: across a phase switch, too.
        where = f"trainer.v1.trainer_mode={launch.verl_mode}" if launch.asynchronous else \
            f"staleness={launch.staleness}"
        raise MethodConfigError(
            f"{where} with algorithm.adv_estimator=r2po: a rollout of an asynchronous mode spans weight updates, so "
            "at a phase switch it samples from the other phase's head; "
            + ("run R2PO in sync mode" if launch.asynchronous else
               "the testbed's stale rounds sample as such a mode does: set staleness=0"))
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
    lora = model.get("lora") or {}
    for key, value in (("lora.rank", lora.get("rank", 0) if hasattr(lora, "get") else None),
                       ("lora_rank", model.get("lora_rank", 0))):
        # verl reads lora.rank, then lora_rank where that is <= 0: any whole number > 0 in either turns LoRA on
        if not isinstance(value, int) or isinstance(value, bool):
            raise MethodConfigError(f"actor_rollout_ref.model.{key}={_shown(value)} with algorithm.adv_estimator=r2po: "
                                    "must be an integer, and 0: R2PO trains the whole model in its policy phase")
        if value > 0:
            raise MethodConfigError(f"actor_rollout_ref.model.{key}={value} with algorithm.adv_estimator=r2po: R2PO "
                                    f"trains the whole model in its policy phase; set {key}=0")


def check_advantage(config: Any) -> None:
    """What would change R2PO's advantages from its source's without a word.

    - A KL penalty in the reward (``algorithm.use_kl_in_reward``) subtracts beta * KL, different for every
      response, from each reward: no two rewards of a group are then equal, every rarity s_i is 1 and every
      head-phase advantage 0 (a group [0, 0, 0, 1] got all zeros at a penalty of 6e-8). The source's KL is the
      loss's (``actor.use_kl_loss``, the preset's).
    - ``algorithm.norm_adv_by_std_in_grpo=false``: both of the source's advantages divide by the group's std
      (``reward_rarity``; ``(rewards - mean) / (std + 1e-4)``, adaptor_grpo_split.py), with no switch; the range
      skip and its epsilon are set for that scale. Refused rather than honoured: unscaled, neither is R2PO's.
    """
    kl = setting(config, "algorithm.use_kl_in_reward", False)
    if kl is not False:
        raise MethodConfigError(
            f"algorithm.use_kl_in_reward={_shown(kl)} with algorithm.adv_estimator=r2po: a KL penalty makes every "
            "reward of a group distinct, so every rarity count is 1 and every head-phase advantage 0; R2PO's KL is the "
            "loss's (actor_rollout_ref.actor.use_kl_loss, as its source); set algorithm.use_kl_in_reward=false")
    norm = setting(config, "algorithm.norm_adv_by_std_in_grpo", True)
    if norm is not True:
        raise MethodConfigError(
            f"algorithm.norm_adv_by_std_in_grpo={_shown(norm)} with algorithm.adv_estimator=r2po: R2PO's advantages "
            "divide by the group's std, as its source's do (it has no switch); set it to true")


def _shown(value: Any) -> str:
    """A setting's value as the command line writes it (true, null, 'abc')."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return repr(value) if isinstance(value, str) else str(value)


def check_model(config: Any, local_copy: bool = True) -> None:
    """verl must import the recipe's model classes where it builds a model (``actor_rollout_ref.model.external_lib``),
    and the model must carry a rollout head or be a local folder (the launch then trains a copy with one, made in
    the run's checkpoint folder: ``recipe_apo.main``). ``local_copy=False`` (the testbed, whose policy is its own):
    the first only."""
    lib = setting(config, "actor_rollout_ref.model.external_lib")
    if lib != EXTERNAL_LIB:
        raise MethodConfigError(
            f"actor_rollout_ref.model.external_lib={lib} with algorithm.adv_estimator=r2po: verl must import "
            f"{EXTERNAL_LIB} where it builds the model (the rollout-head classes); the r2po preset sets it")
    if not local_copy:
        return
    path = setting(config, "actor_rollout_ref.model.path")
    folder = Path(str(path)).expanduser()
    if not folder.is_dir():
        raise MethodConfigError(
            f"actor_rollout_ref.model.path={path} with algorithm.adv_estimator=r2po: R2PO trains a rollout head "
            "beside the policy, added to a local copy of the model; download the model and give its folder, or "
            f"make the copy yourself: python scripts/r2po_head.py add <model folder> <folder>")
    from recipe_apo.methods.r2po.model import RolloutHeadError, read_config

    try:
        read_config(folder)
    except RolloutHeadError as exc:
        raise MethodConfigError(f"actor_rollout_ref.model.path={path}: {exc}") from None
