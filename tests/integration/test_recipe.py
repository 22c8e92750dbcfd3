"""The recipe entry: presets, validation, naming, dry runs and multirun (no Ray, no GPU)."""

import os
import subprocess
import sys

import pytest
from helpers.composing import LAUNCHABLE, compose_recipe
from helpers.in_process import run_recipe_main
from omegaconf import OmegaConf

from recipe_apo.integration.validation import RecipeConfigError, validate_recipe_config
from recipe_apo.main import experiment_name

L0 = 3000


def composed(*overrides, resolve=True):
    return compose_recipe(*overrides, resolve=resolve)


def method_settings(config):
    actor = config.actor_rollout_ref.actor
    return {
        "adv_estimator": config.algorithm.adv_estimator,
        "norm_adv_by_std_in_grpo": config.algorithm.norm_adv_by_std_in_grpo,
        "use_kl_in_reward": config.algorithm.use_kl_in_reward,
        "loss_mode": actor.policy_loss.loss_mode,
        "loss_agg_mode": actor.loss_agg_mode,
        "loss_scale_factor": actor.loss_scale_factor,
        "clip_ratio": (actor.clip_ratio, actor.clip_ratio_low, actor.clip_ratio_high),
        "taus": (actor.tau_pos, actor.tau_neg),
        "use_kl_loss": actor.use_kl_loss,
    }


EXPECTED = {
    "grpo": {
        "adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
        "loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-mean", "loss_scale_factor": None,
        "clip_ratio": (0.2, 0.2, 0.2), "taus": (1.0, 1.05), "use_kl_loss": False,
    },
    "drgrpo": {
        "adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False, "use_kl_in_reward": False,
        "loss_mode": "vanilla", "loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": L0,
        "clip_ratio": (0.2, 0.2, 0.2), "taus": (1.0, 1.05), "use_kl_loss": False,
    },
    "apo": {
        "adv_estimator": "apo", "norm_adv_by_std_in_grpo": False, "use_kl_in_reward": False,
        "loss_mode": "apo", "loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": L0,
        "clip_ratio": (0.2, 0.2, 0.2), "taus": (1.0, 1.5), "use_kl_loss": False,
    },
    # CoDaPO's code: std-normalized advantages, verl's vanilla clip and default token-mean.
    "codapo": {
        "adv_estimator": "codapo", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False,
        "loss_mode": "vanilla", "loss_agg_mode": "token-mean", "loss_scale_factor": None,
        "clip_ratio": (0.2, 0.2, 0.2), "taus": (1.0, 1.05), "use_kl_loss": False,
    },
}


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "apo", "codapo"])
def test_each_preset_composes_to_its_exact_settings(method):
    config = composed(f"method={method}", f"data.max_response_length={L0}")
    assert method_settings(config) == EXPECTED[method]
    assert config.trainer.v1.trainer_mode == "apo_sync"
    assert config.algorithm.apo.lambda_scale == 1.5 and config.algorithm.apo.eta_min == 0.05


def test_apo_is_the_default_method_and_presets_win_over_the_base():
    assert method_settings(composed(f"data.max_response_length={L0}")) == EXPECTED["apo"]
    # A command-line override still beats the preset.
    config = composed("method=apo", "actor_rollout_ref.actor.tau_neg=2.0")
    assert config.actor_rollout_ref.actor.tau_neg == 2.0


def test_the_recipe_yaml_declares_the_estimators_defaults_exactly():
    from dataclasses import asdict

    from recipe_apo.methods.apo.settings import ApoSettings
    from recipe_apo.methods.codapo.estimator import CodapoSettings

    assert OmegaConf.to_container(composed().algorithm.apo) == asdict(ApoSettings())
    assert OmegaConf.to_container(composed().algorithm.codapo) == asdict(CodapoSettings())
    assert composed().algorithm.zero_variance == "keep"


def valid(*overrides):
    return composed("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
                    f"data.max_response_length={L0}", *overrides)


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "apo", "codapo"])
def test_valid_presets_pass_validation(method):
    validate_recipe_config(valid(f"method={method}"))
    validate_recipe_config(valid(f"method={method}", "algorithm.zero_variance=exclude"))


def test_the_one_sided_gate_is_one_documented_override_on_apo():
    config = valid("method=apo", "actor_rollout_ref.actor.policy_loss.loss_mode=apo_one_sided")
    validate_recipe_config(config)
    assert (config.actor_rollout_ref.actor.tau_pos, config.actor_rollout_ref.actor.tau_neg) == (1.0, 1.5)


def test_kl_in_reward_is_fine_with_a_threshold_success_and_data_sources_with_the_recipe_trainer():
    validate_recipe_config(valid("algorithm.use_kl_in_reward=true", "algorithm.apo.success=threshold"))
    validate_recipe_config(valid("algorithm.apo.anchor_scope=data_source"))


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algorithm.apo.lambda_scale=0"], "algorithm.apo.lambda_scale"),
        (["algorithm.apo.history=0"], "algorithm.apo.history"),
        (["algorithm.apo.eta=-1"], "algorithm.apo.eta"),
        (["+algorithm.apo.lambda=2"], "algorithm.apo.lambda"),
        (["actor_rollout_ref.actor.loss_scale_factor=null"], "actor_rollout_ref.actor.loss_scale_factor"),
        (["method=drgrpo", "actor_rollout_ref.actor.loss_scale_factor=null"],
         "actor_rollout_ref.actor.loss_scale_factor"),
        (["actor_rollout_ref.actor.loss_scale_factor=-5"], "actor_rollout_ref.actor.loss_scale_factor"),
        (["actor_rollout_ref.actor.tau_neg=0"], "actor_rollout_ref.actor.tau_neg"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=apo_one_sided", "actor_rollout_ref.actor.tau_pos=-1"],
         "actor_rollout_ref.actor.tau_pos"),
        (["algorithm.adv_estimator=apo_typo"], "algorithm.adv_estimator"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=nope"], "actor_rollout_ref.actor.policy_loss.loss_mode"),
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n"),
        (["algorithm.use_kl_in_reward=true"], "algorithm.use_kl_in_reward"),
        (["algorithm.apo.anchor_scope=data_source", "trainer.v1.trainer_mode=sync"], "algorithm.apo.anchor_scope"),
        (["trainer.use_v1=false"], "trainer.use_v1"),
        (["method=codapo", "trainer.v1.trainer_mode=sync"], "algorithm.adv_estimator=codapo needs"),
        (["method=codapo", "algorithm.codapo.percentile=1.0"], "algorithm.codapo.percentile"),
        (["method=codapo", "algorithm.codapo.repeat_count=0"], "algorithm.codapo.repeat_count"),
        (["method=codapo", "+algorithm.codapo.offset=0.2"], "algorithm.codapo.offset"),
        (["method=codapo", "data.gen_batch_size=8"], "data.gen_batch_size"),
        (["method=codapo", "algorithm.filter_groups.enable=true"], "algorithm.filter_groups.enable=true"),
        (["method=codapo", "actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n"),
        (["algorithm.zero_variance=drop"], "algorithm.zero_variance"),
        (["algorithm.zero_variance=exact"], "algorithm.zero_variance=exact is the testbed's"),
        (["algorithm.zero_variance=exclude", "actor_rollout_ref.actor.loss_agg_mode=token-sum",
          "actor_rollout_ref.actor.loss_scale_factor=null"], "loss_agg_mode=token-sum"),
        (["algorithm.zero_variance=exclude", "trainer.v1.trainer_mode=sync"], "algorithm.zero_variance=exclude needs"),
        (["actor_rollout_ref.rollout.name=???"], "actor_rollout_ref.rollout.name"),
        # Accepted by verl, but meaning something else than they say:
        (["method=drgrpo", "algorithm.adv_estimator=grpo_vectorized"], "adv_estimator=grpo"),
        (["algorithm.norm_adv_by_std_in_grpo=true"], "algorithm.norm_adv_by_std_in_grpo=true"),
        (["method=drgrpo", "actor_rollout_ref.actor.policy_loss.loss_mode=sapo"], "loss_mode=sapo ignores"),
        # geo_mean never calls agg_loss: no alternative with the same gate to offer, unlike sapo.
        (["method=drgrpo", "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean"],
         "loss_mode=geo_mean ignores loss_agg_mode=seq-mean-token-sum-norm: verl's geo_mean always aggregates with "
         "seq-mean-token-mean; set that"),
        (["method=grpo", "actor_rollout_ref.actor.loss_scale_factor=3000"],
         "actor_rollout_ref.actor.loss_scale_factor"),
        # The type, not the count, is at fault:
        (["actor_rollout_ref.rollout.n='8'"], "actor_rollout_ref.rollout.n must be an integer"),
        (["actor_rollout_ref.rollout.n=2.5"], "actor_rollout_ref.rollout.n must be an integer"),
        # Quoted booleans: a non-empty string is true to Python, whatever it says.
        (["method=grpo", "algorithm.norm_adv_by_std_in_grpo='false'"],
         "algorithm.norm_adv_by_std_in_grpo must be true or false, got 'false' (a string: drop the quotes)"),
        (["method=codapo", "algorithm.norm_adv_by_std_in_grpo='true'"], "algorithm.norm_adv_by_std_in_grpo must be"),
        (["algorithm.use_kl_in_reward='false'"], "algorithm.use_kl_in_reward must be true or false, got 'false'"),
        (["algorithm.use_pf_ppo=0"], "algorithm.use_pf_ppo must be true or false, got 0"),
        (["algorithm.filter_groups.enable='false'"], "algorithm.filter_groups.enable must be true or false"),
        (["algorithm.rollout_correction.bypass_mode='no'"], "algorithm.rollout_correction.bypass_mode must be"),
        (["algorithm.apo.reweight='false'"], "algorithm.apo.reweight must be true or false"),
        (["method=codapo", "algorithm.codapo.resample='false'"], "algorithm.codapo.resample must be true or false"),
        (["trainer.use_v1='true'"], "trainer.use_v1 must be true or false"),
        (["actor_rollout_ref.actor.shuffle='true'"], "actor_rollout_ref.actor.shuffle must be true or false"),
        (["dry_run='false'"], "dry_run must be true or false, got 'false'"),
        # CoDaPO's settings that passed and then overflowed or exhausted memory:
        (["method=codapo", "algorithm.codapo.weight_offset=1e39"], "algorithm.codapo.weight_offset must be <="),
        (["method=codapo", "algorithm.codapo.repeat_count=1000000000000"],
         "algorithm.codapo.repeat_count must be an integer in [1, "),
        # The zero-variance denominator: a misspelt mode, and the KL penalty in the reward.
        (["algorithm.zero_variance=exclude", "actor_rollout_ref.actor.loss_agg_mode=tokenmean"],
         "actor_rollout_ref.actor.loss_agg_mode=tokenmean is not one of verl's modes: token-mean, token-sum"),
        (["method=grpo", "algorithm.zero_variance=exclude", "algorithm.use_kl_in_reward=true"],
         "algorithm.zero_variance=exclude with algorithm.use_kl_in_reward=true"),
        # CoDaPO's own check of the KL reward comes first (the methods' checks run in catalog order).
        (["method=codapo", "algorithm.zero_variance=exclude", "algorithm.use_kl_in_reward=true"],
         "algorithm.use_kl_in_reward=true with algorithm.adv_estimator=codapo"),
    ],
)
def test_invalid_settings_fail_validation_naming_the_key(overrides, key):
    with pytest.raises(RecipeConfigError) as info:
        validate_recipe_config(valid(*overrides))
    assert key in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "apo", "codapo", "agpo"])
def test_every_boolean_of_the_composed_algorithm_node_is_a_checked_flag(method):
    """The flags come from verl's typed AlgoConfig; every boolean the composed config holds under algorithm (verl's
    yaml, the recipe's nodes) must be among them or be a method setting that checks its own."""
    from recipe_apo.integration.flags import boolean_settings

    def booleans(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from booleans(value, f"{prefix}{key}.")
            elif isinstance(value, bool):
                yield prefix + key

    composed_flags = set(booleans(OmegaConf.to_container(valid(f"method={method}").algorithm), "algorithm."))
    checked = {key for key, _ in boolean_settings()} | {"algorithm.apo.reweight", "algorithm.codapo.resample",
                                                        "algorithm.agpo.saturated_signal"}
    assert composed_flags and composed_flags <= checked
    assert {"dry_run", "trainer.use_v1", "algorithm.norm_adv_by_std_in_grpo"} <= checked


def test_a_repeat_count_off_codapos_tiling_is_warned_about_as_codapos_code_does():
    from recipe_apo.integration.validation import config_warnings

    def codapo_lines(*overrides):
        return [w for w in config_warnings(valid("method=codapo", *overrides)) if "algorithm.codapo" in w]

    # 1 / (1 - 0.75) = 4: the default tiles the batch evenly; so do 3 and 5 within 0.5 of 1 / (1 - 0.7) = 3.33.
    assert codapo_lines() == []
    assert codapo_lines("algorithm.codapo.percentile=0.7", "algorithm.codapo.repeat_count=3") == []
    assert codapo_lines("algorithm.codapo.repeat_count=2") == [
        "algorithm.codapo.repeat_count=2 is more than 0.5 away from 1 / (1 - algorithm.codapo.percentile) = 4.00 "
        "(percentile 0.75): the resampled step will not tile the batch evenly, so the kept prompts are over- or "
        "under-sampled unevenly (CoDaPO's code warns the same); consider repeat_count=4"
    ]
    # Without resampling the two settings are not used.
    assert codapo_lines("algorithm.codapo.repeat_count=2", "algorithm.codapo.resample=false") == []
    assert [w for w in config_warnings(valid("method=apo", "algorithm.codapo.repeat_count=2"))
            if "algorithm.codapo" in w] == []


def test_geo_mean_is_accepted_with_its_own_aggregation_and_warned_about_for_its_micro_batch_mean():
    from recipe_apo.integration.validation import config_warnings

    def micro_batch_lines(config):
        return [w for w in config_warnings(config) if "averages over each micro-batch" in w]

    config = valid("method=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean")
    validate_recipe_config(config)  # grpo's seq-mean-token-mean is geo_mean's own shape
    (line,) = micro_batch_lines(config)
    assert line.startswith("actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean averages over each micro-batch")
    assert "k equal micro-batches per rank make the update k times as large" in line
    assert all(micro_batch_lines(valid(f"method={method}")) == [] for method in ("grpo", "drgrpo", "apo", "codapo"))


def test_experiment_names_are_deterministic_distinct_and_leave_out_paths():
    task = ["method=apo", "data.train_files=/x/train.parquet", "algorithm.apo.lambda_scale=1.1",
            "+algorithm.apo.eta=0.5", "trainer.logger=[console]", "dry_run=true", "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.model.path=/models/Qwen2.5-Math-1.5B/", "data.max_response_length=3000"]
    short = [t for t in task[:-1] if not t.startswith("data.train_files")]
    # The model is shortened to its folder's name, so the full path counts through a hash at the end.
    assert experiment_name("apo", short).startswith(
        "apo-model=Qwen2.5-Math-1.5B-apo.eta=0.5-apo.lambda_scale=1.1-rollout.n=8-")
    assert experiment_name("apo", task).startswith("apo-model=Qwen2.5-Math-1.5B-train_files=train.parquet-apo.eta=0.5-")
    assert experiment_name("apo", list(reversed(task))) == experiment_name("apo", task)
    assert experiment_name("grpo", []) == "grpo"
    # Runs that train differently never share a name (and so a checkpoint folder).
    other_model = [t.replace("1.5B", "7B") for t in task]
    other_l0 = [t.replace("3000", "1024") for t in task]
    names = {experiment_name("apo", t) for t in (task, other_model, other_l0)}
    assert len(names) == 3
    long = experiment_name("apo", [f"algorithm.apo.history={'9' * 200}"])
    assert len(long) <= 96 and long != experiment_name("apo", [f"algorithm.apo.history={'8' * 200}"])


def run_main(*args, cwd):
    """The entry as a process of its own (the other entry tests run it in this process: tests/helpers/in_process.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    return subprocess.run([sys.executable, "-m", "recipe_apo.main", *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env=env)


def test_cfg_job_prints_the_composed_config_without_starting_ray(tmp_path):
    result = run_recipe_main("method=drgrpo", "data.max_response_length=1024", "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = OmegaConf.create(result.stdout)
    assert config.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"
    assert config.algorithm.norm_adv_by_std_in_grpo is False
    assert "Ray" not in result.stdout + result.stderr


@pytest.mark.fresh_process
def test_a_bad_setting_stops_the_launch_with_one_line(tmp_path):
    result = run_main("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
                      "algorithm.apo.lambda_scale=-1", cwd=tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("recipe-apo: error:")]
    assert errors == ["recipe-apo: error: algorithm.apo.lambda_scale must be a number in (0, 1000], got -1"]
    assert "Traceback" not in result.stderr


def test_a_quoted_boolean_stops_a_dry_run_and_the_codapo_warning_is_said_once(tmp_path):
    result = run_recipe_main("method=grpo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
                             "algorithm.norm_adv_by_std_in_grpo='false'", "dry_run=true", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "recipe-apo: error: algorithm.norm_adv_by_std_in_grpo must be true or false, got 'false' "
        "(a string: drop the quotes)")
    result = run_recipe_main("method=codapo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
                             "algorithm.codapo.repeat_count=2", "dry_run=true", *LAUNCHABLE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "algorithm.codapo.repeat_count=2" in line]
    assert len(warned) == 1 and warned[0].startswith("recipe-apo: warning: ")


def test_multirun_dry_run_gives_each_job_its_own_name_folders_and_method(tmp_path):
    result = run_recipe_main("-m", "method=grpo,drgrpo,apo", "algorithm.apo.lambda_scale=1.1", "dry_run=true",
                             "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.name=vllm", *LAUNCHABLE,
                             f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    experiments = [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("experiment:")]
    checkpoints = [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("checkpoints:")]
    assert experiments == [f"recipe_apo/{m}-apo.lambda_scale=1.1-actor.use_dynamic_bsz=True-rollout.n=8"
                           for m in ("grpo", "drgrpo", "apo")]
    assert len(set(checkpoints)) == 3
    jobs = sorted((tmp_path / "sweep").glob("[0-9]"))
    assert len(jobs) == 3
    methods = [OmegaConf.load(job / ".hydra" / "config.yaml").algorithm.adv_estimator for job in jobs]
    assert methods == ["grpo", "grpo", "apo"]
    assert result.stdout.count("dry run: stopping before Ray starts") == 3


def launchable(*overrides):
    return valid("data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=1",
                 "trainer.experiment_name=t", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", *overrides)


@pytest.mark.parametrize("ray_before", [False, True])
def test_launch_hands_verl_the_recipe_task_runner_and_ends_its_ray_session(monkeypatch, ray_before):
    """Each multirun job gets its own Ray session: the one verl's run_ppo started ends with the job; a session the
    caller had started stays. (Ray's state is a flag here: starting a real session costs seconds.)"""
    import ray
    import verl.trainer.main_ppo as main_ppo

    from recipe_apo.integration.task_runner import RecipeTaskRunner
    from recipe_apo.main import run

    seen = {"up": ray_before, "shutdowns": 0}

    def fake_run_ppo(config, task_runner_class):
        seen["runner"] = task_runner_class
        seen["up"] = True  # verl's run_ppo starts Ray unless it is up

    def shutdown():
        seen["up"], seen["shutdowns"] = False, seen["shutdowns"] + 1

    monkeypatch.setattr(main_ppo, "run_ppo", fake_run_ppo)
    monkeypatch.setattr(ray, "is_initialized", lambda: seen["up"])
    monkeypatch.setattr(ray, "shutdown", shutdown)
    run(launchable())
    assert seen["runner"] is RecipeTaskRunner
    assert (seen["up"], seen["shutdowns"]) == ((True, 0) if ray_before else (False, 1))


@pytest.mark.parametrize("method, checked", [("apo", True), ("codapo", True), ("grpo", False), ("drgrpo", False)])
def test_task_runner_registers_the_trainer_and_checks_the_nodes_for_apo(monkeypatch, method, checked):
    from verl.trainer.main_ppo import TaskRunnerV1

    import recipe_apo.integration.cluster as cluster
    from recipe_apo.integration.task_runner import RecipeTaskRunner, _RecipeTaskRunner

    calls = []
    monkeypatch.setattr(cluster, "check_recipe_on_every_node", lambda: calls.append("checked"))
    monkeypatch.setattr(TaskRunnerV1.__ray_actor_class__, "run", lambda self, config: calls.append("verl run"))
    assert issubclass(RecipeTaskRunner.__ray_actor_class__, TaskRunnerV1.__ray_actor_class__)
    _RecipeTaskRunner().run(launchable(f"method={method}"))
    assert calls == (["checked", "verl run"] if checked else ["verl run"])

    from verl.trainer.ppo.v1 import get_trainer_cls

    from recipe_apo.integration.trainer import RecipeSyncTrainer

    assert get_trainer_cls("apo_sync") is RecipeSyncTrainer


def test_plugin_check_prints_the_three_presets_advantages(capsys):
    from recipe_apo.__main__ import main

    main()
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("hard prompt", "easy prompt"))]
    # GRPO: (1 - 0.25) / std([1,0,0,0]) = 1.5; Dr. GRPO: 0.75; APO: 0.75 * 1.5 * exp(0.25) = 1.445. AGPO's dual
    # feedback has GRPO's advantages (its controllers act on the sampling and the clip): no column repeats another.
    # AGPO, on its authors' -1/+1 scale (algorithm.agpo.wrong_reward=-1): the hard prompt's one right answer gets no
    # bonus (1.5, GRPO's: the std normalizes the scale away); the easy prompt's right answers of 30, 60, 45 tokens
    # are shaped 1.1, 1.0, 1.05, the wrong one -1 (mean 0.5375, sample std sqrt(3.156875 / 3) = 1.02581):
    # (1.1 - 0.5375) / 1.02581 = 0.548, (-1 - 0.5375) / 1.02581 = -1.499.
    assert rows[0][-4:] == ["1.500", "0.750", "1.445", "1.500"]
    assert rows[4][-1] == "0.548"
    assert rows[7][-4:] == ["-1.500", "-0.750", "-1.445", "-1.499"]
    assert "agpo_dual not on this batch: the same advantages as GRPO" in " ".join(out.split())
    assert "codapo not on this batch: its estimator also needs the old policy's log-probs" in " ".join(out.split())
    assert "python -m recipe_apo.main method=apo" in out


def test_balance_batch_off_is_said_to_have_no_effect_in_verls_v1_trainer():
    from recipe_apo.integration.validation import config_warnings

    said = [w for w in config_warnings(valid("method=apo", "trainer.balance_batch=false")) if "balance_batch" in w]
    assert said == ["trainer.balance_batch=false has no effect in verl 0.9.1's V1 trainer: it always balances each "
                    "step's batch across the data-parallel ranks by sequence length (trainer_base._balance_batch)"]
    assert not [w for w in config_warnings(valid("method=apo")) if "balance_batch" in w]


# separate_async's rollout pool and weight transfer, which verl's constructor asserts (read in that mode only).
SEPARATE_POOL = ("actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=8",
                 "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")


def test_verls_trainer_modes_run_the_recipes_trainer_for_each(tmp_path):
    result = run_recipe_main("-m", "method=apo", "trainer.v1.trainer_mode=sync,colocate_async,separate_async",
                             "dry_run=true", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.name=vllm",
                             *SEPARATE_POOL, *LAUNCHABLE,
                             f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    trainers = [line for line in result.stdout.splitlines() if line.startswith("trainer:")]
    assert trainers == [f"trainer: apo_{mode} (verl's {mode} with the recipe's hooks)"
                        for mode in ("sync", "colocate_async", "separate_async")]
    experiments = [line for line in result.stdout.splitlines() if line.startswith("experiment:")]
    # The sweep's key names each job (the default mode too: jobs of one sweep never share a name).
    assert [line.split("-actor.", 1)[0] for line in experiments] == [
        f"experiment: recipe_apo/apo-trainer.v1.trainer_mode={mode}" for mode in ("sync", "colocate_async",
                                                                                  "separate_async")]


@pytest.mark.parametrize("mode", ["apo_colocate_async", "apo_separate_async"])
def test_the_recipes_features_pass_in_the_asynchronous_trainers_but_codapos_resampling(mode):
    from recipe_apo.integration.trainer import RecipeColocateAsyncTrainer, RecipeSeparateAsyncTrainer

    validate_recipe_config(valid("method=apo", f"trainer.v1.trainer_mode={mode}", *SEPARATE_POOL,
                                 "algorithm.apo.anchor_scope=data_source", "algorithm.zero_variance=exclude"))
    validate_recipe_config(valid("method=codapo", f"trainer.v1.trainer_mode={mode}", "algorithm.codapo.resample=false",
                                 *SEPARATE_POOL))
    with pytest.raises(RecipeConfigError, match=r"^algorithm.codapo.resample=true with trainer.v1.trainer_mode="
                                                r"(colocate|separate)_async: CoDaPO's second step"):
        validate_recipe_config(valid("method=codapo", f"trainer.v1.trainer_mode={mode}", *SEPARATE_POOL))
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer = get_trainer_cls(mode)
    assert trainer in (RecipeColocateAsyncTrainer, RecipeSeparateAsyncTrainer) and trainer.VERL_MODE == mode[4:]


@pytest.mark.parametrize("seed, said", [
    ("01", "data.seed='01': null or a whole number in [0, 4294967295] (a string: Hydra reads 01 as '01'; write 1)"),
    ("1.5", "data.seed=1.5: null or a whole number in [0, 4294967295]"),
    ("abc", "data.seed='abc': null or a whole number in [0, 4294967295]"),
    ("1180591620717411303424", "data.seed=1180591620717411303424: null or a whole number in [0, 4294967295]"),
    ("true", "data.seed=True: null or a whole number in [0, 4294967295]"),
    ("-1", "data.seed=-1: null or a whole number in [0, 4294967295]"),
])
def test_a_seed_torch_cannot_take_is_refused_before_ray_starts(seed, said):
    from helpers.composing import compose_recipe

    from recipe_apo.errors import RecipeError
    from recipe_apo.integration.validation import validate_recipe_config

    config = compose_recipe("method=apo", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
                            f"data.seed={seed}")
    with pytest.raises(RecipeError) as refused:
        validate_recipe_config(config)
    assert str(refused.value) == said
    validate_recipe_config(compose_recipe("method=apo", "actor_rollout_ref.rollout.name=vllm",
                                          "actor_rollout_ref.rollout.n=8", "data.seed=4294967295"))


def test_a_verl_without_the_v1_task_runner_is_one_line_naming_its_version_and_the_plain_verl_command(monkeypatch):
    """verl's neo branch deletes TaskRunnerV1: the launch says so before anything imports the recipe's runner."""
    import types

    import verl

    monkeypatch.setitem(sys.modules, "verl.trainer.main_ppo", types.ModuleType("verl.trainer.main_ppo"))
    monkeypatch.setattr(verl, "__version__", "0.10.0.dev", raising=False)
    with pytest.raises(RecipeConfigError) as refused:
        validate_recipe_config(valid())
    message = str(refused.value)
    assert "\n" not in message
    assert "verl 0.10.0.dev has no verl.trainer.main_ppo.TaskRunnerV1" in message
    assert "python -m verl.trainer.main_ppo trainer.use_v1=false algorithm.adv_estimator=apo" in message
