"""Every path users and configs name keeps working after the package's move into layers, loaded the way verl
(or Python, or Hydra) loads it."""

import importlib.resources
import importlib.util

from omegaconf import OmegaConf
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
from verl.utils.import_utils import load_extern_object


def test_the_reward_function_by_its_pkg_path_is_the_scorer():
    from recipe_apo.reward.scorer import compute_score

    assert load_extern_object(module_path="pkg://recipe_apo.reward", object_name="compute_score") is compute_score


def test_the_reward_manager_by_its_old_and_new_pkg_paths_is_one_class():
    from recipe_apo.reward.truncation import TruncationAwareRewardManager

    for path in ("pkg://recipe_apo.reward_manager", "pkg://recipe_apo.reward.truncation"):
        assert load_extern_object(module_path=path, object_name="TruncationAwareRewardManager") \
            is TruncationAwareRewardManager


def test_the_plain_verl_checkpoint_callback_by_its_documented_name():
    from recipe_apo.integration.checkpoint import AnchorCheckpointCallback

    config = OmegaConf.create({
        "trainer": {"checkpoint_callback_class": "recipe_apo.checkpoint.AnchorCheckpointCallback"},
        "algorithm": {"adv_estimator": "grpo"},
    })
    callback = build_checkpoint_callback(config)
    assert type(callback) is AnchorCheckpointCallback and not callback.active


def test_importing_recipe_apo_trainer_registers_the_recipes_trainer_mode():
    from verl.trainer.ppo.v1 import get_trainer_cls

    import recipe_apo.trainer
    from recipe_apo.integration.trainer import ApoSyncTrainer

    assert recipe_apo.trainer.ApoSyncTrainer is ApoSyncTrainer
    assert get_trainer_cls("apo_sync") is ApoSyncTrainer


def test_the_rehearsals_worker_module_and_the_configs_are_where_configs_name_them():
    # VERL_USE_EXTERNAL_MODULES=recipe_apo.cpu.activate (conf/rehearsal/cpu.yaml); importing it would switch
    # this process to the CPU platform, so only its location is checked here (the rehearsal tests import it).
    assert importlib.util.find_spec("recipe_apo.cpu.activate") is not None
    configs = importlib.resources.files("recipe_apo.conf")
    for name in ("apo_trainer.yaml", "testbed.yaml", "method/apo.yaml", "truncation/zero.yaml", "rehearsal/cpu.yaml"):
        assert configs.joinpath(name).is_file(), name

