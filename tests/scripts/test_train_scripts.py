"""scripts/train_*.sh compose the configs the paper describes, for each method (scripts/evaluate.py:
test_evaluate.py).

Each script prints its command with RECIPE_APO_DRY_RUN=args; the overrides are composed here with Hydra's
compose API on the recipe's config (what `python -m recipe_apo.main` composes, without a process per case),
resolved, and checked by the recipe's and verl's own config validation. One script also runs end to end with
RECIPE_APO_DRY_RUN=1 (`--cfg job`).
"""

import os
import subprocess
import sys

import pytest
import yaml
from helpers.in_process import run_recipe_main
from helpers.paths import ROOT as REPO_ROOT
from omegaconf import OmegaConf

ROOT = str(REPO_ROOT)
SCRIPTS = {
    "1.5b": "scripts/train_qwen2.5_math_1.5b.sh",
    "7b": "scripts/train_qwen2.5_math_7b.sh",
    "0.5b": "scripts/train_qwen2.5_0.5b_gsm8k.sh",
}
METHODS = ("grpo", "drgrpo", "apo", "codapo", "agpo_dual", "agpo")


def script_command(script, *args, env=None, dry_run="args"):
    full_env = {**os.environ, "RECIPE_APO_DRY_RUN": dry_run, "PYTHON": sys.executable, "DATA_DIR": "/data/recipe_apo"}
    full_env.pop("METHOD", None)
    full_env.pop("EXPERIMENT_NAME", None)
    full_env.update(env or {})
    return subprocess.run(["bash", os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=300)


def overrides_of(script, *args, env=None):
    result = script_command(script, *args, env=env)
    assert result.returncode == 0, result.stderr
    command = result.stdout.splitlines()
    assert command[:3] == [sys.executable, "-m", "recipe_apo.main"]
    return command[3:]


@pytest.fixture(scope="module")
def compose():
    from helpers.composing import compose_recipe

    # Resolved: what recipe_apo.main does before validating.
    return lambda overrides: compose_recipe(*overrides)


def validate(config):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from recipe_apo.integration.validation import route_agent_loops, validate_recipe_config

    route_agent_loops(config)  # as the launch does (recipe_apo.main.prepare)
    validate_recipe_config(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return need_reference_policy(config), need_critic(config)


def updates_per_round(config):
    # verl: ppo_mini_batch_size counts prompts and is multiplied by rollout.n (trainer _update_actor)
    n = config.actor_rollout_ref.rollout.n
    rollouts = config.data.train_batch_size * n
    per_update = config.actor_rollout_ref.actor.ppo_mini_batch_size * n
    assert rollouts % per_update == 0
    return rollouts // per_update * config.actor_rollout_ref.actor.ppo_epochs


METHOD_SETTINGS = {
    "grpo": dict(adv_estimator="grpo", norm=True, loss_mode="vanilla", agg="seq-mean-token-mean"),
    "drgrpo": dict(adv_estimator="grpo", norm=False, loss_mode="vanilla", agg="seq-mean-token-sum-norm"),
    "apo": dict(adv_estimator="apo", norm=False, loss_mode="apo", agg="seq-mean-token-sum-norm"),
    "codapo": dict(adv_estimator="codapo", norm=True, loss_mode="vanilla", agg="token-mean"),
    "agpo_dual": dict(adv_estimator="grpo", norm=True, loss_mode="agpo_clip", agg="seq-mean-token-mean"),
    "agpo": dict(adv_estimator="agpo", norm=True, loss_mode="agpo", agg="token-mean"),
}


def check_method(config, method, l0):
    expected = METHOD_SETTINGS[method]
    actor = config.actor_rollout_ref.actor
    assert config.algorithm.adv_estimator == expected["adv_estimator"]
    assert config.algorithm.norm_adv_by_std_in_grpo is expected["norm"]
    assert actor.policy_loss.loss_mode == expected["loss_mode"]
    assert actor.loss_agg_mode == expected["agg"]
    assert actor.loss_scale_factor == (None if method in ("grpo", "codapo", "agpo_dual", "agpo") else l0)
    # AGPO's loss has its source's KL term (0.03, k1); no method puts the KL in the reward
    assert actor.use_kl_loss is (method == "agpo_dual") and config.algorithm.use_kl_in_reward is False
    if method == "agpo":  # the authors' script: clip 0.2 / 0.28 and verl's group filter
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28) and config.algorithm.filter_groups.enable
    elif method != "apo":
        assert actor.clip_ratio_low == actor.clip_ratio_high == 0.2


def check_recording_and_fairness(config):
    from recipe_apo.integration.validation import config_warnings

    actor, trainer = config.actor_rollout_ref.actor, config.trainer
    assert actor.shuffle is True and config_warnings(config) == []  # mini-batches of mixed lengths
    assert config.data.shuffle is True and config.data.seed == 42  # every method sees the same prompt order
    # the run's seed reseeds vLLM's sampling and the mini-batch shuffle too
    assert config.actor_rollout_ref.rollout.seed == config.actor_rollout_ref.actor.data_loader_seed == 42
    manager = config.reward.reward_manager  # truncated responses score 0 (Dr. GRPO)
    assert (manager.source, manager.name, manager.module.path) == (
        "importlib", "TruncationAwareRewardManager", "pkg://recipe_apo.reward.truncation")
    assert trainer.rollout_data_dir == f"{trainer.default_local_dir}/rollouts"
    assert trainer.validation_data_dir == f"{trainer.default_local_dir}/validation"
    assert list(trainer.logger) == ["console", "file"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_paper_runs_map_section_5_1(compose, size, method):
    config = compose(overrides_of(SCRIPTS[size], f"method={method}"))
    # no critic; a reference model for AGPO's KL term only
    assert validate(config) == (method == "agpo_dual", False)
    data, rollout, actor = config.data, config.actor_rollout_ref.rollout, config.actor_rollout_ref.actor
    assert rollout.n == 8  # 8 rollouts per question
    assert data.max_response_length == 3000 and rollout.response_length == 3000  # 3,000-token cap
    assert data.train_batch_size * rollout.n == 1024  # 1,024 rollouts per round
    assert actor.ppo_mini_batch_size * rollout.n == 128  # batch of 128 per update
    assert updates_per_round(config) == 8  # 8 updates per round
    assert data.max_prompt_length + data.max_response_length <= 4096  # Qwen2.5-Math's context
    assert data.train_files == "/data/recipe_apo/math_lvl3to5.parquet"
    assert list(data.val_files) == [f"/data/recipe_apo/{b}.parquet"
                                    for b in ("aime24", "amc", "math500", "minerva", "olympiadbench")]
    assert config.actor_rollout_ref.model.path == {"1.5b": "Qwen/Qwen2.5-Math-1.5B", "7b": "Qwen/Qwen2.5-Math-7B"}[size]
    assert rollout.temperature == 1.0 and rollout.top_p == 1.0
    # Validation samples 4 answers per problem from the policy's own distribution: mean pass@1, not greedy
    val = rollout.val_kwargs
    assert (val.n, val.do_sample, val.temperature, val.top_p) == (4, True, 1.0, 1.0)
    assert config.trainer.max_actor_ckpt_to_keep is None and config.trainer.save_freq == 64  # every one kept
    assert actor.optim.lr == 1e-6 and actor.optim.lr_scheduler_type == "constant"
    assert list(actor.optim.betas) == [0.9, 0.95] and actor.optim.weight_decay == 0.0  # Dr. GRPO's (Oat's)
    assert config.reward.custom_reward_function.path == "pkg://recipe_apo.reward"
    assert config.reward.custom_reward_function.name == "compute_score"
    assert config.trainer.n_gpus_per_node == 8 and config.trainer.test_freq == 16
    assert config.run_name.prefix == f"qwen2.5-math-{size}"  # the run's name: see test_run_names_*
    check_recording_and_fairness(config)
    check_method(config, method, l0=3000)


@pytest.mark.parametrize("method", METHODS)
def test_small_gsm8k_run(compose, method):
    config = compose(overrides_of(SCRIPTS["0.5b"], f"method={method}"))
    validate(config)
    assert config.trainer.n_gpus_per_node == 1
    assert config.actor_rollout_ref.rollout.n == 8
    assert updates_per_round(config) == 8
    assert config.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.data.train_files == "/data/recipe_apo/gsm8k_train.parquet"
    assert config.data.val_files == "/data/recipe_apo/gsm8k_test.parquet"
    val = config.actor_rollout_ref.rollout.val_kwargs  # greedy: cheap, not the paper's table
    assert (val.n, val.do_sample, val.temperature) == (1, False, 0)
    assert config.trainer.max_actor_ckpt_to_keep is None
    check_recording_and_fairness(config)
    check_method(config, method, l0=config.data.max_response_length)


def test_method_from_environment_and_default(compose):
    assert "method=drgrpo" in overrides_of(SCRIPTS["1.5b"], env={"METHOD": "drgrpo"})
    assert "method=apo" in overrides_of(SCRIPTS["1.5b"])  # the default
    # method= anywhere on the line, passed once
    args = overrides_of(SCRIPTS["1.5b"], "trainer.logger=[console]", "method=grpo")
    assert [a for a in args if a.startswith("method=")] == ["method=grpo"]


def test_bad_method_is_refused():
    from recipe_apo.integration import presets

    result = script_command(SCRIPTS["7b"], "method=ppo")
    # The message names every preset (the files of conf/method/, by file name).
    assert result.returncode == 2 and (f"method must be one of the presets in conf/method/ "
                                       f"({', '.join(sorted(presets.names()))}), got 'ppo'") in result.stderr


def test_further_overrides_pass_through_and_win(compose):
    config = compose(overrides_of(SCRIPTS["1.5b"], "method=apo", "data.max_response_length=2048",
                                  "algorithm.apo.eta=0.5", "+trainer.extra_note=x"))
    assert config.data.max_response_length == 2048
    assert config.actor_rollout_ref.actor.loss_scale_factor == 2048  # L0 follows the cap
    assert config.algorithm.apo.eta == 0.5


def dry_run_in_process(script, *args, cwd, env=None):
    """The script's dry run (RECIPE_APO_DRY_RUN=1 appends dry_run=true): the command it would exec, as it prints
    it, run through recipe_apo.main in this process (tests/helpers/in_process.py). Each script keeps one dry run as a
    process of its own: test_every_script_dry_runs_through_the_recipe."""
    return run_recipe_main(*overrides_of(script, *args, env=env), "dry_run=true", cwd=cwd)


def dry_run_names(script, *args, cwd, env=None):
    """The experiment names recipe_apo.main gives the script's run(s), from its dry run (no Ray)."""
    result = dry_run_in_process(script, *args, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    return [line.split("/", 1)[1] for line in result.stdout.splitlines() if line.startswith("experiment: ")]


@pytest.mark.fresh_process
def test_run_names_change_with_data_model_and_method_in_the_dry_run(tmp_path):
    # The bug this guards against: runs differing in data settings or the model shared a name, so
    # resume_mode=auto let the real run resume the smoke test's checkpoint.
    script = SCRIPTS["1.5b"]
    (base,) = dry_run_names(script, cwd=tmp_path)
    assert base.startswith("qwen2.5-math-1.5b-apo-")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        assert f"checkpoints/recipe_apo/{base}/global_step_" in handle.read()  # README's evaluate example
    # One sweep through the script (Hydra multirun: one name per job): a data setting and the model. (Which
    # settings name a run, data settings among them, is tested without Hydra: test_run_names_separate_settings...)
    swept = dry_run_names(script, "-m", "data.max_response_length=3000,2048",
                          "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B,/models/Qwen2.5-Math-1.5B-Instruct",
                          cwd=tmp_path)
    assert len(swept) == 4 and len(set(swept) | {base}) == 5
    # A swept key is spelled out in every job, even at the script's own value; the hash is the script run's.
    assert swept[0].startswith("qwen2.5-math-1.5b-apo-model=Qwen2.5-Math-1.5B-data.max_response_length=3000-")
    assert swept[0].rsplit("-", 1)[1] == base.rsplit("-", 1)[1]
    assert swept[2].startswith("qwen2.5-math-1.5b-apo-model=Qwen2.5-Math-1.5B-data.max_response_length=2048-")
    # The model from the environment, and the method, in runs of their own.
    (other_model,) = dry_run_names(script, env={"MODEL": "/models/Qwen2.5-Math-1.5B-Instruct"}, cwd=tmp_path)
    (grpo,) = dry_run_names(script, "method=grpo", cwd=tmp_path)
    assert len(set(swept) | {other_model, grpo}) == 6


def name_from_args(args):
    """What recipe_apo.main names a run launched with these overrides (the same function it calls)."""
    from recipe_apo.integration.naming import experiment_name

    settings = dict(arg.split("=", 1) for arg in args if arg.startswith("run_name."))
    method = [arg for arg in args if arg.startswith("method=")][-1].split("=", 1)[1]
    return experiment_name(method, args, prefix=settings["run_name.prefix"],
                           script_overrides=int(settings["run_name.script_overrides"]))


def test_run_names_separate_settings_not_plumbing():
    def name(*args, env=None):
        return name_from_args(overrides_of(SCRIPTS["1.5b"], *args, env=env))

    base = name()
    assert name("method=apo") == base  # the default method, said or not
    # where things are and how they are logged do not change the run
    assert name("trainer.logger=[console,wandb]", "data.val_files=[x]", "trainer.total_training_steps=5") == base
    # the data's path counts (its full path is in the hash): another folder is another run
    assert name(env={"DATA_DIR": "/elsewhere"}) != base
    # an override equal to the script's own value is the same run
    assert name("data.train_batch_size=128") == base
    # what is trained does
    distinct = {base, name("data.train_files=/data/recipe_apo/gsm8k_train.parquet"),
                name("actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B"), name("algorithm.apo.eta=0.5"),
                name("actor_rollout_ref.actor.optim.lr=2e-6"), name("data.max_prompt_length=512")}
    assert len(distinct) == 6
    tuned = name("algorithm.apo.eta=0.5", "actor_rollout_ref.actor.optim.lr=2e-6")
    assert tuned == name("actor_rollout_ref.actor.optim.lr=2e-6", "algorithm.apo.eta=0.5")  # a rerun resumes
    assert tuned.startswith("qwen2.5-math-1.5b-apo-apo.eta=0.5-actor.optim.lr=2e-06-")
    assert "trainer.experiment_name=mine" in overrides_of(SCRIPTS["1.5b"], env={"EXPERIMENT_NAME": "mine"})
    # the 7B script is another run even with the same overrides
    assert name_from_args(overrides_of(SCRIPTS["7b"])) != base


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_script_dry_runs_through_the_recipe(script, tmp_path):
    # RECIPE_APO_DRY_RUN=1: the recipe's dry_run=true, which names, validates and prints where the run writes (the
    # script's command in this process; test_dry_run_prints_the_composed_config_end_to_end execs one for real).
    result = dry_run_in_process(SCRIPTS[script], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    (experiment,) = [line for line in lines if line.startswith("experiment: recipe_apo/")]
    (rollouts,) = [line for line in lines if line.startswith("rollouts: ")]
    assert rollouts == f"rollouts: checkpoints/{experiment.split(': ', 1)[1]}/rollouts"
    assert lines[-1] == "dry run: stopping before Ray starts" and "warning" not in result.stderr


def test_unshuffled_mini_batches_are_warned_about(compose):
    from recipe_apo.integration.validation import config_warnings

    config = compose(overrides_of(SCRIPTS["1.5b"], "actor_rollout_ref.actor.shuffle=false"))
    (warning,) = config_warnings(config)
    assert warning.startswith("8 mini-batches per step with actor_rollout_ref.actor.shuffle=false")
    one_update = compose(overrides_of(SCRIPTS["1.5b"], "actor_rollout_ref.actor.shuffle=false",
                                      "actor_rollout_ref.actor.ppo_mini_batch_size=128"))
    assert config_warnings(one_update) == []  # one mini-batch: its order does not matter


def test_scripts_are_executable_bash():
    # the 1.5B and 7B scripts exec the shared one, which is documented to be run directly too
    for script in (*SCRIPTS.values(), "scripts/train_qwen2.5_math.sh"):
        path = os.path.join(ROOT, script)
        assert os.access(path, os.X_OK), script
        with open(path) as handle:
            assert handle.readline().startswith("#!/usr/bin/env bash")
        assert subprocess.run(["bash", "-n", path]).returncode == 0


@pytest.mark.fresh_process
def test_dry_run_prints_the_composed_config_end_to_end():
    # The real entry point, as a user runs it: python -m recipe_apo.main ... --cfg job (no Ray, no GPU).
    result = script_command(SCRIPTS["1.5b"], "method=drgrpo", dry_run="cfg")
    assert result.returncode == 0, result.stderr[-2000:]
    config = OmegaConf.create(yaml.safe_load(result.stdout))
    assert config.algorithm.adv_estimator == "grpo" and config.algorithm.norm_adv_by_std_in_grpo is False
    assert config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.actor.loss_scale_factor == 3000  # ${data.max_response_length}
    assert config.actor_rollout_ref.actor.ppo_mini_batch_size == 16
    assert config.run_name.prefix == "qwen2.5-math-1.5b" and config.actor_rollout_ref.actor.shuffle is True


def test_a_seed_reseeds_the_run_and_names_it(compose):
    config = compose(overrides_of(SCRIPTS["1.5b"], "data.seed=7"))
    assert config.data.seed == 7  # the prompt order
    assert config.actor_rollout_ref.rollout.seed == 7  # vLLM's sampling
    assert config.actor_rollout_ref.actor.data_loader_seed == 7  # the mini-batch shuffle
    names = [name_from_args(overrides_of(SCRIPTS["1.5b"], f"data.seed={seed}")) for seed in (1, 2)]
    default = name_from_args(overrides_of(SCRIPTS["1.5b"]))
    assert len(set(names)) == 2 and default not in names
    assert name_from_args(overrides_of(SCRIPTS["1.5b"], "data.seed=42")) == default  # the script's own seed


def test_each_seed_is_a_run_named_by_its_seed_in_the_dry_run(tmp_path):
    # As recipe_apo.main names it. The sweep of docs/paper.md gives each job this name: a swept key is spelled
    # out (test_run_names_change_with_data_model_and_method_in_the_dry_run).
    (named,) = dry_run_names(SCRIPTS["1.5b"], "data.seed=7", cwd=tmp_path)
    assert named.startswith("qwen2.5-math-1.5b-apo-data.seed=7-")
    with open(os.path.join(ROOT, "docs", "paper.md"), encoding="utf-8") as handle:
        assert "scripts/train_qwen2.5_math_1.5b.sh -m method=$m data.seed=1,2,3" in handle.read()


def test_checkpoints_kept_can_be_capped(compose):
    config = compose(overrides_of(SCRIPTS["7b"], "trainer.max_actor_ckpt_to_keep=3"))
    assert config.trainer.max_actor_ckpt_to_keep == 3


@pytest.mark.parametrize("env, expected", [
    ({"VAL_N": "8", "VAL_TEMPERATURE": "0.6", "VAL_TOP_P": "0.95"}, (8, True, 0.6, 0.95)),
    ({"VAL_N": "1"}, (1, True, 1.0, 1.0)),  # one sampled answer
    ({"VAL_N": "greedy"}, (1, False, 0, 1.0)),  # Dr. GRPO's greedy evaluation
])
def test_validation_sampling_from_the_environment(compose, env, expected):
    config = compose(overrides_of(SCRIPTS["1.5b"], env=env))
    validate(config)  # verl's own check: sampled validation needs a rollout temperature above 0
    val = config.actor_rollout_ref.rollout.val_kwargs
    assert (val.n, val.do_sample, val.temperature, val.top_p) == expected


def test_validation_settings_from_the_command_line_win(compose):
    config = compose(overrides_of(SCRIPTS["1.5b"], "actor_rollout_ref.rollout.val_kwargs.n=16"))
    assert config.actor_rollout_ref.rollout.val_kwargs.n == 16


@pytest.mark.parametrize("env, message", [
    ({"VAL_N": "0"}, "VAL_N must be a number of samples per problem (1 or more) or 'greedy', got '0'"),
    ({"VAL_N": "4x"}, "VAL_N must be a number of samples per problem (1 or more) or 'greedy', got '4x'"),
    ({"VAL_TEMPERATURE": "0"}, "VAL_TEMPERATURE must be a number above 0 (VAL_N=greedy for greedy decoding), "
                               "got '0'"),
    ({"VAL_TEMPERATURE": "hot"}, "VAL_TEMPERATURE must be a number above 0 (VAL_N=greedy for greedy decoding), "
                                 "got 'hot'"),
    ({"VAL_TOP_P": "1.5"}, "VAL_TOP_P must be a number in (0, 1], got '1.5'"),
    ({"VAL_TOP_P": "0"}, "VAL_TOP_P must be a number in (0, 1], got '0'"),
    ({"VAL_N": "greedy", "VAL_TEMPERATURE": "0.6"}, "VAL_TEMPERATURE and VAL_TOP_P are for sampled validation; "
                                                    "VAL_N=greedy decodes at temperature 0"),
])
def test_bad_validation_settings_are_refused_in_one_line(env, message):
    result = script_command(SCRIPTS["1.5b"], env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: {message}\n"
