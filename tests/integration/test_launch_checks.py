"""Settings that verl's Ray workers read minutes into a run, refused by the launch in one line before Ray starts
(recipe_apo.integration.verl_settings, validation.CHECKERS, the CPU rehearsal's checks): the trainer mode, the
trainer.v1.* settings, the token budgets of dynamic batch sizes, the cluster's size, CoDaPO with KL-penalised
rewards. Each class: the config-level refusal with its exact message, the valid neighbours that still pass, and a
dry run that refuses what the launch refuses."""

from __future__ import annotations

import pytest
from helpers.composing import compose_recipe
from helpers.in_process import run_recipe_main
from omegaconf import open_dict

from recipe_apo.cpu.checks import check_rehearsal_config
from recipe_apo.integration import presets
from recipe_apo.integration.modes import recipe_mode
from recipe_apo.integration.validation import RecipeConfigError, validate_recipe_config
from recipe_apo.integration.verl_settings import registered_trainers

# separate_async's own rollout pool and weight transfer (read in that mode only): what verl's constructor asserts.
POOL = ("actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=8",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")
BASE = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8", *POOL)
KNOWN = "known: apo_colocate_async, apo_separate_async, apo_sync, colocate_async, separate_async, sync"
LONGEST = 1024  # verl's data.max_prompt_length + data.max_response_length (512 + 512)


def launch_config(*overrides: str, rehearsal: bool = False):
    """The config as recipe_apo.main.prepare hands it to the checks, with verl's mode name swapped for the recipe's
    trainer (``recipe_mode(...)``). Left unresolved: OmegaConf resolves each interpolation as a check reads
    it, to what ``OmegaConf.resolve`` gives, and resolving the whole config would take most of a test's time."""
    base = ("rehearsal=cpu", "actor_rollout_ref.rollout.n=2") if rehearsal else BASE
    config = compose_recipe(*base, *overrides, resolve=False)
    with open_dict(config):
        config.trainer.v1.trainer_mode = recipe_mode(config.trainer.v1.get("trainer_mode", "sync"))
    return config


def refusal(*overrides: str, rehearsal: bool = False) -> str:
    config = launch_config(*overrides, rehearsal=rehearsal)
    with pytest.raises(RecipeConfigError) as info:
        if rehearsal:
            check_rehearsal_config(config)
        validate_recipe_config(config, rehearsal=rehearsal)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- 6. trainer.v1.trainer_mode --------------------------------------------------------------------------------
@pytest.mark.parametrize("value, shown, hint", [
    ("Sync", "Sync", " (did you mean sync?)"),
    ("SYNC", "SYNC", " (did you mean sync?)"),
    ("colocate-async", "colocate-async", " (did you mean colocate_async?)"),
    ("colocate_asnyc", "colocate_asnyc", " (did you mean colocate_async?)"),
    ("' sync'", "' sync'", " (did you mean sync?)"),
    ("Separate_Async", "Separate_Async", " (did you mean separate_async?)"),
    ("apo_Sync", "apo_Sync", " (did you mean apo_sync?)"),
    ("null", "null", ""),
    ("1", "1", ""),
])
def test_a_trainer_mode_verl_has_not_registered_is_refused_naming_the_registered_ones(value, shown, hint):
    message = refusal(f"trainer.v1.trainer_mode={value}")
    assert message.startswith(f"trainer.v1.trainer_mode={shown} is not a registered trainer{hint}; {KNOWN}")


@pytest.mark.parametrize("value", ["Separate_Async", "colocate-async"])
def test_the_rehearsal_refuses_an_unknown_mode_before_its_separate_async_test(value):
    config = launch_config(f"trainer.v1.trainer_mode={value}", rehearsal=True)
    with pytest.raises(RecipeConfigError, match=rf"^trainer.v1.trainer_mode={value} is not a registered trainer"):
        check_rehearsal_config(config)


def test_the_names_read_without_importing_verls_trainer_are_its_registry_once_imported():
    """The launch does not import verl's trainer (seconds, and verl's warnings before the one-line refusal): it
    reads the names off verl's decorators; the same names verl registers, with the recipe's."""
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    import recipe_apo.integration.trainer  # noqa: F401  (registers the recipe's, as the task runner does)

    assert set(registered_trainers()) == set(TRAINER_REGISTRY) >= {"sync", "colocate_async", "separate_async",
                                                                   "apo_sync", "apo_colocate_async",
                                                                   "apo_separate_async"}


def test_every_registered_trainer_passes_a_users_own_included():
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    config = launch_config()
    for mode in ("sync", "colocate_async", "separate_async", "apo_sync", "apo_colocate_async"):
        with open_dict(config):
            config.trainer.v1.trainer_mode = recipe_mode(mode)
        validate_recipe_config(config)

    class MyTrainer(PPOTrainerSync):
        pass

    register_trainer("my_trainer")(MyTrainer)
    try:
        assert "my_trainer" in registered_trainers()
        validate_recipe_config(launch_config("trainer.v1.trainer_mode=my_trainer"))
    finally:
        del TRAINER_REGISTRY["my_trainer"]
    assert "my_trainer is not a registered trainer" in refusal("trainer.v1.trainer_mode=my_trainer")


# ---- 7. trainer.v1.* -------------------------------------------------------------------------------------------
COLOCATE, SEPARATE = "trainer.v1.trainer_mode=colocate_async", "trainer.v1.trainer_mode=separate_async"
WARMUP = "trainer.v1.colocate_async.num_warmup_batches"


@pytest.mark.parametrize("overrides, expected", [
    ([COLOCATE, f"{WARMUP}=abc"], f"{WARMUP} must be a finite number, got 'abc'"),
    ([COLOCATE, f"{WARMUP}=true"], f"{WARMUP} must be a finite number, got True"),
    ([COLOCATE, f"{WARMUP}=-1"], f"{WARMUP} must be >= 0, got -1"),
    ([COLOCATE, f"{WARMUP}=1e9"],
     f"{WARMUP}=1000000000.0 is above trainer.v1.sampler.max_off_policy_threshold=8: warm-up batches are drawn "
     "before the first step, and beyond 8 the replay buffer would drop them or hold training for them"),
    ([SEPARATE, "trainer.v1.separate_async.num_warmup_batches=8.5"],
     "trainer.v1.separate_async.num_warmup_batches=8.5 is above trainer.v1.sampler.max_off_policy_threshold=8"),
    ([COLOCATE, f"{WARMUP}=20", "trainer.v1.sampler.max_off_policy_threshold=null",
      "trainer.total_training_steps=10"],
     f"{WARMUP}=20 is above trainer.total_training_steps=10: warm-up batches are drawn before the first step, and "
     "beyond 10 the run never trains the rest; use a number in [0, 10]"),
    ([SEPARATE, "trainer.v1.separate_async.parameter_sync_step=0"],
     "trainer.v1.separate_async.parameter_sync_step must be an integer >= 1, got 0"),
    ([SEPARATE, "trainer.v1.separate_async.parameter_sync_step=-1"],
     "trainer.v1.separate_async.parameter_sync_step must be an integer >= 1, got -1"),
    ([SEPARATE, "trainer.v1.separate_async.parameter_sync_step=2.5"],
     "trainer.v1.separate_async.parameter_sync_step must be an integer >= 1, got 2.5"),
    ([SEPARATE, "trainer.v1.separate_async.parameter_sync_step=abc"],
     "trainer.v1.separate_async.parameter_sync_step must be an integer >= 1, got 'abc'"),
    ([SEPARATE, "trainer.v1.separate_async.parameter_sync_step=2"],
     "trainer.v1.separate_async.parameter_sync_step=2 with data.train_batch_size=1024 and "
     "actor_rollout_ref.actor.ppo_mini_batch_size=256: verl's separate_async trainer needs train_batch_size = "
     "parameter_sync_step * ppo_mini_batch_size (one mini-batch per weight sync); set it to 4"),
    (["+trainer.v1.sync.parameter_sync_step=3"],
     "trainer.v1.sync.parameter_sync_step=3 does not divide data.train_batch_size=1024"),
    (["+trainer.v1.sync.parameter_sync_step=0"], "trainer.v1.sync.parameter_sync_step must be an integer >= 1, got 0"),
    ([COLOCATE, "+trainer.v1.colocate_async.parameter_sync_step=-1"],
     "trainer.v1.colocate_async.parameter_sync_step must be an integer >= 1, got -1"),
    (["trainer.v1.sync=5"], "trainer.v1.sync=5 must be a mapping of the sync trainer's settings"),
    ([SEPARATE, "trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio=0"],
     "trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio must be a number in (0, 1], got 0"),
    ([SEPARATE, "trainer.v1.separate_async.hybrid_rollout.switch_cost_window_size=2.5"],
     "trainer.v1.separate_async.hybrid_rollout.switch_cost_window_size must be an integer >= 1, got 2.5"),
    ([SEPARATE, "+trainer.v1.separate_async.hybrid_rollout.enable_swich=true"],
     "trainer.v1.separate_async.hybrid_rollout.enable_swich is not a setting of verl's HybridRolloutSwitchConfig; "
     "known: enable_switch, "),
    (["trainer.v1.sampler.max_off_policy_threshold=0"],
     "trainer.v1.sampler.max_off_policy_threshold must be an integer >= 1, got 0 (or null: no staleness control)"),
    (["trainer.v1.sampler.max_off_policy_strategy=dorp"],
     "trainer.v1.sampler.max_off_policy_strategy must be one of drop, wait, got 'dorp'"),
    (["trainer.v1.sampler.sync_refill_failed_groups='false'"],
     "trainer.v1.sampler.sync_refill_failed_groups must be true or false, got 'false'"),
])
def test_a_v1_setting_of_the_wrong_type_or_range_is_refused_naming_it(overrides, expected):
    assert refusal(*overrides).startswith(expected)


@pytest.mark.parametrize("overrides", [
    [COLOCATE, f"{WARMUP}=0"], [COLOCATE, f"{WARMUP}=0.5"], [COLOCATE, f"{WARMUP}=8"],
    [COLOCATE, f"{WARMUP}=50", "trainer.v1.sampler.max_off_policy_threshold=null"],
    [SEPARATE, "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.actor.ppo_mini_batch_size=512"],
    ["+trainer.v1.sync.parameter_sync_step=2"],
    [SEPARATE, "trainer.v1.separate_async.hybrid_rollout.enable_switch=true"],
    ["trainer.v1.sampler.max_off_policy_threshold=null", "trainer.v1.sampler.max_off_policy_strategy=wait"],
])
def test_valid_v1_settings_still_pass(overrides):
    validate_recipe_config(launch_config(*overrides))


@pytest.mark.parametrize("overrides, expected", [
    (["actor_rollout_ref.rollout.nnodes=0"],
     "actor_rollout_ref.rollout.nnodes=0: trainer.v1.trainer_mode=separate_async generates on a rollout pool of its "
     "own and needs a whole number >= 1 here"),
    (["actor_rollout_ref.rollout.n_gpus_per_node=1.5"], "actor_rollout_ref.rollout.n_gpus_per_node=1.5: "),
    (["actor_rollout_ref.rollout.checkpoint_engine.backend=naive"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend=naive: trainer.v1.trainer_mode=separate_async sends the "
     "weights to its own rollout pool and needs a transfer backend"),
    (["reward.reward_model.enable=true", "reward.reward_model.enable_resource_pool=false"],
     "reward.reward_model.enable_resource_pool=false with trainer.v1.trainer_mode=separate_async"),
])
def test_separate_async_without_a_rollout_pool_of_its_own_is_refused(overrides, expected):
    """verl's separate_async constructor asserts these after the model load (trainer_separate_async.py:64-76);
    verl's defaults (rollout.nnodes=0, the naive checkpoint engine) fail there."""
    assert refusal(SEPARATE, *overrides).startswith(expected)
    validate_recipe_config(launch_config(*overrides))  # read in separate_async only


# ---- 8. token budgets with dynamic batch sizes ------------------------------------------------------------------
DYNAMIC = "actor_rollout_ref.actor.use_dynamic_bsz=true"
ACTOR_BUDGET = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"


def budget_message(key, value, flag, extra=""):
    return (f"{key}={value}{extra} with {flag}=true is below data.max_prompt_length + data.max_response_length = "
            f"{LONGEST}: verl packs whole sequences into micro-batches of at most that many tokens per GPU, so the "
            "longest must fit; set ")


@pytest.mark.parametrize("overrides, expected", [
    *[([DYNAMIC, f"{ACTOR_BUDGET}={value}"],
       budget_message(ACTOR_BUDGET, value, "actor_rollout_ref.actor.use_dynamic_bsz") + f"it to at least {LONGEST}")
      for value in (4, 0, -5, 1023)],
    ([DYNAMIC, f"{ACTOR_BUDGET}=abc"], f"{ACTOR_BUDGET} must be an integer, got 'abc'"),
    ([DYNAMIC, f"{ACTOR_BUDGET}=500", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     budget_message(ACTOR_BUDGET, 500, "actor_rollout_ref.actor.use_dynamic_bsz",
                    " x actor_rollout_ref.actor.ulysses_sequence_parallel_size=2") + "it to at least 512"),
    # The old log-probs (the rollout's budget, run by the actor's engine) and the reference's, when there is one.
    ([DYNAMIC, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=100"],
     budget_message("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", 100,
                    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz")),
    ([DYNAMIC, "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8"],
     budget_message("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", 8,
                    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz")),
    # verl's V1 trainer sizes the critic's micro-batches by ppo_infer_max_token_len_per_gpu (default 32768).
    (["algorithm.adv_estimator=gae", DYNAMIC, "data.max_prompt_length=40000",
      f"{ACTOR_BUDGET}=50000", "actor_rollout_ref.rollout.n=1"],
     "critic.ppo_infer_max_token_len_per_gpu=32768 with critic.use_dynamic_bsz=true is below data.max_prompt_length "
     "+ data.max_response_length = 40512"),
    (["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true"],
     "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true with actor_rollout_ref.actor.use_dynamic_bsz=false: "
     "verl's actor worker needs both the same"),
    (["actor_rollout_ref.actor.use_dynamic_bsz='true'"],
     "actor_rollout_ref.actor.use_dynamic_bsz must be true or false, got 'true'"),
])
def test_a_token_budget_the_longest_sequence_does_not_fit_is_refused(overrides, expected):
    assert refusal(*overrides).startswith(expected)


@pytest.mark.parametrize("overrides", [
    [DYNAMIC, f"{ACTOR_BUDGET}={LONGEST}"],
    [DYNAMIC, f"{ACTOR_BUDGET}=512", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
    [DYNAMIC, "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=8"],  # no reference: no KL anywhere
    [f"{ACTOR_BUDGET}=4"],  # fixed micro-batches: the budget is not read
])
def test_budgets_that_fit_or_are_not_read_still_pass(overrides):
    validate_recipe_config(launch_config(*overrides))


# ---- 9. the cluster's size ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, value, shown", [
    ("n_gpus_per_node", "1.5", "1.5"), ("n_gpus_per_node", "abc", "'abc'"), ("n_gpus_per_node", "0", "0"),
    ("nnodes", "1.5", "1.5"), ("nnodes", "abc", "'abc'"), ("nnodes", "-1", "-1"),
])
def test_nodes_and_gpus_per_node_must_be_whole_numbers_of_at_least_one(key, value, shown):
    assert refusal(f"trainer.{key}={value}") == f"trainer.{key} must be an integer >= 1, got {shown}"


@pytest.mark.parametrize("override, expected", [
    ("trainer.n_gpus_per_node=1.5", "trainer.n_gpus_per_node must be an integer, got 1.5"),
    ("trainer.n_gpus_per_node=abc", "trainer.n_gpus_per_node must be an integer, got 'abc'"),
    ("trainer.nnodes=1.5", "trainer.nnodes must be an integer, got 1.5"),
    ("trainer.nnodes=abc", "trainer.nnodes must be an integer, got 'abc'"),
    ("ray_kwargs.ray_init.num_gpus=1.5", "ray_kwargs.ray_init.num_gpus must be an integer, got 1.5"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=abc",
     "actor_rollout_ref.rollout.tensor_model_parallel_size must be an integer, got 'abc'"),
])
def test_the_rehearsal_takes_no_fraction_or_text_for_a_count(override, expected):
    assert refusal(override, rehearsal=True) == expected


# ---- 2. CoDaPO's accuracy and KL-penalised rewards -------------------------------------------------------------
def test_codapo_with_kl_in_the_reward_is_refused_with_the_kl_loss_as_the_way_out():
    message = refusal("method=codapo", "algorithm.use_kl_in_reward=true")
    assert message.startswith("algorithm.use_kl_in_reward=true with algorithm.adv_estimator=codapo: CoDaPO counts "
                              "a response as correct when its reward is exactly 1.0")
    assert message.endswith("use the KL loss instead (actor_rollout_ref.actor.use_kl_loss=true, "
                            "algorithm.use_kl_in_reward=false)")
    validate_recipe_config(launch_config("method=codapo", "actor_rollout_ref.actor.use_kl_loss=true"))


def test_codapo_beside_dapos_overlong_penalty_is_warned_about():
    """The same trap on the reward's side, for long responses only: a warning, not a refusal."""
    from recipe_apo.integration.validation import config_warnings

    penalty = ("reward.reward_manager.name=dapo", "+reward.reward_kwargs.overlong_buffer_cfg.enable=true")
    warned = [w for w in config_warnings(launch_config("method=codapo", *penalty)) if "overlong" in w]
    assert warned == [
        "algorithm.adv_estimator=codapo with reward.reward_manager.name=dapo and "
        "reward.reward_kwargs.overlong_buffer_cfg.enable=true: DAPO's overlong penalty lowers the reward of responses "
        "longer than max_resp_len - overlong_buffer_cfg.len, so a correct long one scores below 1.0 and CoDaPO's "
        "accuracy (rewards exactly 1.0) counts it as wrong"]
    assert not [w for w in config_warnings(launch_config(*penalty)) if "overlong" in w]


# ---- defaults, and the whole launch ----------------------------------------------------------------------------
def test_the_default_config_passes_in_each_mode_and_in_the_rehearsal():
    """Each method's default config in each mode: tests/integration/test_recipe.py (test_valid_presets_pass_validation,
    test_verls_trainer_modes_run_the_recipes_trainer_for_each, ..._asynchronous_trainers_...), which run these
    checks too; here the recipe's default method in each mode, and the rehearsal's config."""
    config = launch_config()
    for mode in ("sync", "colocate_async", "separate_async"):
        with open_dict(config):
            config.trainer.v1.trainer_mode = recipe_mode(mode)
        validate_recipe_config(config)
    config = launch_config(rehearsal=True)
    check_rehearsal_config(config)
    validate_recipe_config(config, rehearsal=True)


@pytest.mark.parametrize("overrides, expected", [
    (["rehearsal=cpu", "trainer.v1.trainer_mode=Separate_Async"],
     "trainer.v1.trainer_mode=Separate_Async is not a registered trainer (did you mean separate_async?)"),
    ([SEPARATE, "trainer.v1.separate_async.parameter_sync_step=-1"],
     "trainer.v1.separate_async.parameter_sync_step must be an integer >= 1, got -1"),
    ([DYNAMIC, f"{ACTOR_BUDGET}=4"], f"{ACTOR_BUDGET}=4 with actor_rollout_ref.actor.use_dynamic_bsz=true"),
    (["trainer.n_gpus_per_node=1.5"], "trainer.n_gpus_per_node must be an integer >= 1, got 1.5"),
    # A node a preset reads, deleted (agpo_dual's rollout.temperature interpolates its base_temperature).
    (["method=agpo_dual", "algorithm.agpo_dual=null"], "a setting does not resolve: ConfigTypeError"),
    # The preset's method turned off by the command line (method=agpo_dual's loss replaced).
    (["method=agpo_dual", "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"],
     "method=agpo_dual with algorithm.adv_estimator=grpo and actor_rollout_ref.actor.policy_loss.loss_mode=vanilla: "
     "these settings turn AGPO (dual) off"),
    # verl's own check (verl.utils.config.validate_config), which main_ppo runs before Ray: in the dry run too.
    (["data.train_batch_size=3", "actor_rollout_ref.rollout.n=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3"],
     "verl's config check refused the run: real_train_batch_size (9) must be divisible by minimal possible batch "
     "size (8)"),
])
def test_a_dry_run_refuses_what_the_launch_refuses_in_one_line(overrides, expected, tmp_path):
    rollout = [] if "rehearsal=cpu" in overrides else ["actor_rollout_ref.rollout.name=vllm"]
    result = run_recipe_main(*rollout, "actor_rollout_ref.rollout.n=8", *overrides, "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"recipe-apo: error: {lines[-1].removeprefix('recipe-apo: error: ')}"], result.stderr
    assert lines[0].startswith(f"recipe-apo: error: {expected}")
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("page", ["README.md", "docs/training.md"])
def test_the_documented_gpu_command_passes_a_dry_run(page, tmp_path):
    """The page's first ``python -m recipe_apo.main method=apo`` command, as written: it used to leave
    rollout.log_prob_micro_batch_size_per_gpu unset, which verl's own check refuses at the launch."""
    import re
    import shlex

    from helpers.paths import ROOT

    text = (ROOT / page).read_text(encoding="utf-8")
    block = re.search(r"python -m recipe_apo\.main method=apo \\\n(.*?)\n```", text, re.S).group(1)
    arguments = shlex.split(block.replace("\\\n", " ").replace("$HOME", "/home/user"))
    result = run_recipe_main("method=apo", *arguments, "dry_run=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-1000:]
    assert "dry run: stopping before Ray starts" in result.stdout


# ---- verl's loss settings, for every method (issue 51, item 5) ---------------------------------------------------
METHODS = presets.names()
ACTOR = "actor_rollout_ref.actor."


@pytest.mark.parametrize("overrides, expected", [
    ([f"{ACTOR}clip_ratio_c=1.0"], f"{ACTOR}clip_ratio_c must be > 1.0, got 1.0"),
    ([f"{ACTOR}clip_ratio_c=0.5"], f"{ACTOR}clip_ratio_c must be > 1.0, got 0.5"),
    ([f"{ACTOR}clip_ratio_c=nan"], f"{ACTOR}clip_ratio_c must be a finite number, got nan"),
    ([f"{ACTOR}clip_ratio=-0.2"], f"{ACTOR}clip_ratio must be >= 0.0, got -0.2"),
    ([f"{ACTOR}clip_ratio=nan"], f"{ACTOR}clip_ratio must be a finite number, got nan"),
    ([f"{ACTOR}clip_ratio_low=nan"], f"{ACTOR}clip_ratio_low must be a finite number, got nan"),
    ([f"{ACTOR}clip_ratio_high=-0.28"], f"{ACTOR}clip_ratio_high must be >= 0.0, got -0.28"),
    ([f"{ACTOR}clip_ratio_high=inf"], f"{ACTOR}clip_ratio_high must be a finite number, got inf"),
    ([f"{ACTOR}clip_ratio_low=0.0", f"{ACTOR}clip_ratio_high=0.0"],
     f"{ACTOR}clip_ratio_low=0.0 and clip_ratio_high=0.0: the clip range [1 - low, 1 + high] is the single ratio 1"),
    ([f"{ACTOR}clip_ratio_low=1.5"],
     f"{ACTOR}clip_ratio_low=1.5: the clip range's lower end 1 - clip_ratio_low = -0.5 is below 0"),
    ([f"{ACTOR}clip_ratio_low='0.2'"], f"{ACTOR}clip_ratio_low must be a finite number, got '0.2'"),
    ([f"{ACTOR}kl_loss_coef=nan"], f"{ACTOR}kl_loss_coef must be a finite number, got nan"),
    ([f"{ACTOR}kl_loss_coef=-0.001"], f"{ACTOR}kl_loss_coef must be >= 0.0, got -0.001"),
    ([f"{ACTOR}entropy_coeff=nan"], f"{ACTOR}entropy_coeff must be a finite number, got nan"),
])
@pytest.mark.parametrize("method", METHODS)
def test_verls_loss_settings_out_of_bounds_are_refused_for_every_method(method, overrides, expected):
    assert refusal(f"method={method}", *overrides).startswith(expected)


@pytest.mark.parametrize("overrides", [
    [f"{ACTOR}clip_ratio_c=1.001"],
    [f"{ACTOR}clip_ratio_low=null", f"{ACTOR}clip_ratio_high=null"],  # verl falls back to clip_ratio
    [f"{ACTOR}clip_ratio_low=1.0"],  # no lower bound, said so by the setting
    [f"{ACTOR}clip_ratio_low=0.0"],  # clip above only
    [f"{ACTOR}kl_loss_coef=0.0", f"{ACTOR}entropy_coeff=-0.001"],  # an entropy penalty is a choice
])
def test_loss_settings_in_bounds_still_pass(overrides):
    validate_recipe_config(launch_config(*overrides))


# ---- checkpoint.async_save (issue 51, item 8: verl #7952) -------------------------------------------------------
@pytest.mark.parametrize("override, expected", [
    ("actor_rollout_ref.actor.checkpoint.async_save=true",
     "actor_rollout_ref.actor.checkpoint.async_save=true: verl 0.9.1's trainer then never writes "
     "latest_checkpointed_iteration.txt (it skips it for an asynchronous save, and nothing finishes one), so a resume "
     "starts again from step 0 without a word (verl issue #7952); set it to false"),
    ("critic.checkpoint.async_save=true",
     "critic.checkpoint.async_save=true: verl 0.9.1's trainer never finishes an asynchronous save"),
    ("actor_rollout_ref.actor.checkpoint.async_save='false'",
     "actor_rollout_ref.actor.checkpoint.async_save must be true or false, got 'false' (a string: drop the quotes)"),
    ("+trainer.async_save=true", "trainer.async_save=True is not a setting of verl 0.9.1, which would ignore it; "
                                 "its asynchronous save is actor_rollout_ref.actor.checkpoint.async_save"),
])
def test_an_asynchronous_save_is_refused_as_a_resume_that_silently_restarts(override, expected):
    assert refusal(override).startswith(expected)


def test_the_tracker_skip_is_verls_own_code():
    """What the refusal says of verl 0.9.1: its V1 trainer skips the tracker with async_save, and no worker has the
    finalizer its legacy trainer would call."""
    import inspect

    from verl.trainer.ppo.v1 import trainer_base

    source = inspect.getsource(trainer_base)
    assert 'actor_ckpt_cfg.get("async_save", False)' in source and "async_calls_finalize_fn_exec" not in source
    from verl.workers import engine_workers

    assert "async_calls_finalize_fn_exec" not in inspect.getsource(engine_workers)


# ---- the agent loop (issue 51, item 5) ---------------------------------------------------------------------------
LOOP = "actor_rollout_ref.rollout.agent.default_agent_loop"
LOOP_FILE = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


@pytest.mark.parametrize("overrides, expected", [
    ([f"{LOOP}=no_such_loop"], f"{LOOP}=no_such_loop is not a registered agent loop; known: single_turn_agent, "
                               f"tool_agent (a loop of your own: list it in {LOOP_FILE})"),
    ([f"{LOOP}=Single_Turn_Agent"], f"{LOOP}=Single_Turn_Agent is not a registered agent loop; known: "),
    ([f"{LOOP}=null"], f"{LOOP}=None is not a registered agent loop"),
    ([f"{LOOP}=recipe_sampling"], f"{LOOP}=recipe_sampling: the recipe's recipe_sampling runs the loop each prompt "
                                  "names, this one when it names none"),
    ([f"{LOOP_FILE}=/no/such/loops.yaml"], f"{LOOP_FILE}=/no/such/loops.yaml cannot be read (FileNotFoundError"),
])
def test_an_agent_loop_nothing_registers_is_refused(overrides, expected):
    assert refusal(*overrides).startswith(expected)


def test_a_loop_of_ones_own_file_or_the_rehearsals_passes_and_others_are_named(tmp_path):
    from recipe_apo.cpu import agent_loops

    own = tmp_path / "loops.yaml"
    own.write_text("- name: mine\n  _target_: some.Loop\n")
    validate_recipe_config(launch_config(f"{LOOP_FILE}={own}", f"{LOOP}=mine"))
    validate_recipe_config(launch_config(f"{LOOP_FILE}={own}", f"{LOOP}=tool_agent"))
    assert refusal(f"{LOOP_FILE}={own}", f"{LOOP}=theirs").startswith(
        f"{LOOP}=theirs is not a registered agent loop; known: mine, single_turn_agent, tool_agent")
    validate_recipe_config(launch_config(f"{LOOP_FILE}={agent_loops.CONFIG_PATH}",
                                         f"{LOOP}=recipe_two_turn_alternate"))


# ---- AGPO's group filter and AGPO dual's clip (issue 51, item 5) ------------------------------------------------
@pytest.mark.parametrize("metric", ["score", "pred", "Reward", "null", "''"])
def test_agpos_group_filter_on_another_metric_than_the_rewards_is_refused(metric):
    shown = {"null": "None", "''": ""}.get(metric, metric)
    assert refusal("method=agpo", f"algorithm.filter_groups.metric={metric}").startswith(
        f"algorithm.filter_groups.metric={shown} with algorithm.adv_estimator=agpo: the group filter must classify "
        "AGPO's groups by their rewards, reward (verl's pre-KL score) or acc")


def test_agpos_group_filter_on_reward_or_acc_or_off_passes():
    for overrides in (["algorithm.filter_groups.metric=reward"], ["algorithm.filter_groups.metric=acc"],
                      ["algorithm.filter_groups.enable=false", "algorithm.filter_groups.metric=score"]):
        validate_recipe_config(launch_config("method=agpo", *overrides))


def test_agpo_duals_clip_base_outside_its_bounds_is_refused():
    assert refusal("method=agpo_dual", "algorithm.agpo_dual.clip_base=0.5") == (
        "algorithm.agpo_dual.clip_base=0.5 is outside [clip_min, clip_max] = [0.05, 0.4]: every calm prompt's clip "
        "would sit at a bound")


# ---- a dry run calls nothing a setting names (issue 51, 6b) ------------------------------------------------------
@pytest.mark.parametrize("override, path, target", [
    ("actor_rollout_ref.actor.checkpoint._target_=os.mkdir", "actor_rollout_ref.actor.checkpoint", "os.mkdir"),
    ("algorithm.kl_ctrl._target_=builtins.print", "algorithm.kl_ctrl", "builtins.print"),
    ("actor_rollout_ref.actor._target_=verl.utils.fs.copy_to_local", "actor_rollout_ref.actor",
     "verl.utils.fs.copy_to_local"),  # verl's, but a function
    ("actor_rollout_ref.actor.optim._target_=verl.workers.config.NoSuchConfig", "actor_rollout_ref.actor.optim",
     "verl.workers.config.NoSuchConfig"),
    ("+data.extra._target_=subprocess.getoutput", "data.extra", "subprocess.getoutput"),
])
def test_a_target_that_is_not_one_of_verls_config_classes_is_refused_before_verls_check_builds_it(override, path,
                                                                                                  target):
    assert refusal(override) == (
        f"{path}._target_={target}: verl builds this node as the object its _target_ names when the launch checks "
        "the config (a dry run too), so it must be one of verl's config classes (a dataclass of verl.*), as verl's "
        "own config sets it")


def test_a_dry_run_neither_imports_nor_calls_the_vote_key_and_refuses_a_process_function(tmp_path, monkeypatch):
    """The module would make a folder when imported, its function one named after the response it is handed (the
    launch hands it vote_keys.SAMPLE_RESPONSE): a dry run makes neither."""
    (tmp_path / "dry_run_vote_key.py").write_text(
        "import os\nos.makedirs('imported_at_dry_run', exist_ok=True)\n"
        "def key(text):\n    os.makedirs(text[:12], exist_ok=True)\n    return text\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    made = ("imported_at_dry_run", "The sum is 3")
    common = ("method=agpo_dual", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
              "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.n_gpus_per_node=1",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "dry_run=true")
    result = run_recipe_main(*common, "algorithm.agpo_dual.vote_key=dry_run_vote_key:key", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dry run: stopping before Ray starts" in result.stdout
    assert not any((tmp_path / name).exists() for name in made)
    for spec in ("os:mkdir", "subprocess:getoutput"):
        result = run_recipe_main(*common, f"algorithm.agpo_dual.vote_key={spec}", cwd=tmp_path)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert lines[-1].startswith(f"recipe-apo: error: algorithm.agpo_dual.vote_key='{spec}' is refused: ")
        assert not [line for line in lines if not line.startswith("recipe-apo: ")], result.stderr
    assert not any((tmp_path / name).exists() for name in made)
