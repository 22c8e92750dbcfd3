"""What the launch refuses or warns about in a CoDaPO run, before Ray starts (each check takes a ``Launch``; a
refusal is one ``MethodConfigError`` line naming the key)."""

from __future__ import annotations

from typing import Optional

from recipe_apo.methods.base import Launch
from recipe_apo.methods.codapo import METHOD, uses_codapo
from recipe_apo.methods.codapo.settings import CodapoSettings
from recipe_apo.methods.errors import MethodConfigError

RECIPE_TRAINERS = "trainer.v1.trainer_mode=sync, colocate_async or separate_async"


def _settings(launch: Launch) -> CodapoSettings:
    return CodapoSettings.from_algorithm_config(launch.config.algorithm)


@METHOD.launch_check
def check_trainer(launch: Launch) -> None:
    """Refuses CoDaPO outside the recipe's trainer: only it hands the old policy's log-probs to the estimator."""
    if not uses_codapo(launch.config) or launch.recipe_trainer:
        return
    mode = launch.config.trainer.get("v1", {}).get("trainer_mode", "sync")
    raise MethodConfigError(
        f"algorithm.adv_estimator=codapo needs the recipe's trainer ({RECIPE_TRAINERS}; got {mode}): only the "
        "recipe's trainer hands the old policy's log-probs to the estimator"
        + (" and resamples prompts" if _settings(launch).resample else "")
    )


@METHOD.launch_check
def check_resampling(launch: Launch) -> None:
    """Refuses CoDaPO's resampling beside whatever changes a step's prompts: asynchronous trainers, verl's group
    filter, a generation batch other than the training batch (each breaks the pairs of steps)."""
    config = launch.config
    if not uses_codapo(config) or not _settings(launch).resample:
        return
    if launch.asynchronous:
        raise MethodConfigError(
            f"algorithm.codapo.resample=true with trainer.v1.trainer_mode={launch.verl_mode}: CoDaPO's second "
            "step of a pair trains on prompts kept from the first, but verl's asynchronous trainers draw "
            "prompts ahead of their step (warm-up, refills); set algorithm.codapo.resample=false (the "
            "confidence-difficulty weighting alone) or use trainer.v1.trainer_mode=sync"
        )
    filter_groups = config.algorithm.get("filter_groups", None) or {}
    if filter_groups.get("enable", False):
        raise MethodConfigError(
            "algorithm.filter_groups.enable=true with algorithm.codapo.resample=true: verl's group filter "
            "refills a step with new loader prompts, which breaks CoDaPO's pairs; set one of them to false"
        )
    gen_batch = config.data.get("gen_batch_size", None)
    if gen_batch not in (None, config.data.train_batch_size):
        raise MethodConfigError(
            f"data.gen_batch_size={gen_batch} with algorithm.codapo.resample=true: the resampled step builds "
            f"one batch of data.train_batch_size prompts; unset gen_batch_size or set resample=false"
        )


@METHOD.launch_check
def check_rewards(launch: Launch) -> None:
    """Refuses CoDaPO with algorithm.use_kl_in_reward=true: CoDaPO counts a response as correct when its reward
    is exactly 1.0 (``estimator``), and a KL-penalised reward (score - beta * KL) never is, so every group's
    accuracy would be 0 and its confidence-difficulty weight the bare offset."""
    config = launch.config
    if not uses_codapo(config) or not config.algorithm.get("use_kl_in_reward", False):
        return
    raise MethodConfigError(
        "algorithm.use_kl_in_reward=true with algorithm.adv_estimator=codapo: CoDaPO counts a response as correct "
        "when its reward is exactly 1.0, which a KL-penalised reward never is, so every group's accuracy would be 0 "
        "(weight = the bare weight_offset); use the KL loss instead (actor_rollout_ref.actor.use_kl_loss=true, "
        "algorithm.use_kl_in_reward=false)"
    )


@METHOD.launch_warning
def warn_tiling(launch: Launch) -> Optional[str]:
    """A resampling CoDaPO whose repeat_count does not tile the batch: kept prompts are sampled unevenly."""
    if not uses_codapo(launch.config):
        return None
    codapo = _settings(launch)
    return codapo.tiling_warning() if codapo.resample else None


@METHOD.launch_warning
def warn_overlong_penalty(launch: Launch) -> Optional[str]:
    """CoDaPO beside DAPO's overlong penalty (verl's dapo reward manager): a correct but long response scores below
    1.0, and CoDaPO's accuracy counts only rewards exactly 1.0 (the same trap as the KL penalty, for long ones)."""
    from omegaconf import OmegaConf  # on use: importing a method's declaration stays light

    config = launch.config
    manager = OmegaConf.select(config, "reward.reward_manager.name", default=None)
    overlong = OmegaConf.select(config, "reward.reward_kwargs.overlong_buffer_cfg.enable", default=None)
    if not uses_codapo(config) or manager != "dapo" or overlong is not True:
        return None
    return (
        "algorithm.adv_estimator=codapo with reward.reward_manager.name=dapo and "
        "reward.reward_kwargs.overlong_buffer_cfg.enable=true: DAPO's overlong penalty lowers the reward of responses "
        "longer than max_resp_len - overlong_buffer_cfg.len, so a correct long one scores below 1.0 and CoDaPO's "
        "accuracy (rewards exactly 1.0) counts it as wrong"
    )
