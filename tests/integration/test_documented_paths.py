"""Every path users and configs name (README's entry points) is where they name it, loaded the way verl (or
Python, or Hydra) loads it."""

import importlib.resources
import importlib.util

from omegaconf import OmegaConf
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
from verl.utils.import_utils import load_extern_object


def test_the_reward_function_by_its_pkg_path_is_the_scorer():
    from recipe_apo.reward.scorer import compute_score

    assert load_extern_object(module_path="pkg://recipe_apo.reward", object_name="compute_score") is compute_score


def test_the_reward_manager_by_its_pkg_path():
    from recipe_apo.reward.truncation import TruncationAwareRewardManager

    assert load_extern_object(module_path="pkg://recipe_apo.reward.truncation",
                              object_name="TruncationAwareRewardManager") is TruncationAwareRewardManager


def test_the_plain_verl_checkpoint_callback_by_its_documented_name():
    from recipe_apo.integration.checkpoint import AnchorCheckpointCallback

    config = OmegaConf.create({
        "trainer": {"checkpoint_callback_class": "recipe_apo.integration.checkpoint.AnchorCheckpointCallback"},
        "algorithm": {"adv_estimator": "grpo"},
    })
    callback = build_checkpoint_callback(config)
    assert type(callback) is AnchorCheckpointCallback and callback.runtimes == []


def test_readme_plain_verl_command_is_apo():
    from helpers.rehearsal_runs import readme_plain_verl_command

    arguments = readme_plain_verl_command()
    assert "algorithm.adv_estimator=apo" in arguments
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=apo" in arguments
    assert "trainer.checkpoint_callback_class=recipe_apo.integration.checkpoint.AnchorCheckpointCallback" in arguments


def test_readme_plain_verl_command_composes_with_verls_own_config_and_keeps_the_anchor(tmp_path):
    """Every key the command sets is one of verl's (Hydra refuses others), and verl's callback builder gives the
    callback that saves APO's anchor. The command trains, in the whole loop: tests/vllm/test_plain_verl.py."""
    from helpers.rehearsal_runs import readme_plain_verl_command
    from hydra import compose, initialize_config_module

    arguments = [argument.replace("$HOME", "/home/user") for argument in readme_plain_verl_command()[3:]]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=[*arguments, f"trainer.default_local_dir={tmp_path}"])
    assert (config.algorithm.adv_estimator, config.actor_rollout_ref.actor.policy_loss.loss_mode) == ("apo", "apo")
    assert config.algorithm.apo.lambda_scale == 1.5
    callback = build_checkpoint_callback(config)
    assert type(callback).__name__ == "AnchorCheckpointCallback"
    assert [runtime.method.name for runtime in callback.runtimes] == ["apo"]


def test_importing_the_recipes_trainer_registers_its_trainer_mode():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from recipe_apo.integration.trainer import RecipeSyncTrainer

    assert get_trainer_cls("apo_sync") is RecipeSyncTrainer


def test_the_rehearsals_worker_module_and_the_configs_are_where_configs_name_them():
    # VERL_USE_EXTERNAL_MODULES=recipe_apo.cpu.activate (conf/rehearsal/cpu.yaml); importing it would switch
    # this process to the CPU platform, so only its location is checked here (the rehearsal tests import it).
    assert importlib.util.find_spec("recipe_apo.cpu.activate") is not None
    configs = importlib.resources.files("recipe_apo.conf")
    for name in ("apo_trainer.yaml", "testbed.yaml", "method/apo.yaml", "truncation/zero.yaml", "rehearsal/cpu.yaml"):
        assert configs.joinpath(name).is_file(), name

