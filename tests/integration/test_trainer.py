"""The recipe's trainer on verl's real V1 advantage step: TransferQueue, data sources, metrics to a logger.

Ray and TransferQueue run locally on CPU; the trainer object is created without verl's worker setup (which
needs GPUs), and only the methods the recipe overrides are exercised, each calling verl's own implementation
(fixtures in ``conftest.py``).
"""

import json
import math
import os

import numpy as np
import pytest
import torch
import transfer_queue as tq
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorStack
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.tracking import Tracking

from recipe_apo.integration.cluster import check_recipe_on_every_node
from recipe_apo.integration.trainer import RecipeSyncTrainer
from recipe_apo.methods.apo.anchor import AnchorBook, driver_anchors, reset_driver_anchors
from recipe_apo.methods.apo.estimator import compute_apo_advantage
from recipe_apo.methods.driver_state import last_result

STATE_FILE = "apo_state.json"  # APO's state file (recipe_apo.methods.apo's declaration)
REWARDS = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
LENGTHS = [3, 2, 4, 1, 2, 5, 3, 2]
UIDS = ["e1", "e1", "e2", "e2", "h1", "h1", "h2", "h2"]
SOURCES = ["easy"] * 4 + ["hard"] * 4


def put_batch(keys, log_probs=None):
    """Step rows in TransferQueue; ``log_probs``: each row's old token log-prob (one value per row), else 0."""
    log_probs = log_probs or [0.0] * len(LENGTHS)

    def nested(rows):
        return torch.nested.nested_tensor(rows, layout=torch.jagged)

    scores = []
    for reward, length in zip(REWARDS, LENGTHS):
        row = torch.zeros(length)
        row[-1] = reward
        scores.append(row)
    fields = TensorDict({
        "uid": NonTensorStack(*UIDS),
        "data_source": NonTensorStack(*SOURCES),
        "response_mask": nested([torch.ones(n) for n in LENGTHS]),
        "rm_scores": nested(scores),
        "old_log_probs": nested([torch.full((n,), lp) for n, lp in zip(LENGTHS, log_probs)]),
    }, batch_size=len(keys))
    return tq.kv_batch_put(keys=keys, partition_id="train", fields=fields)


def test_advantage_step_uses_one_anchor_per_data_source_and_logs_its_metrics(transfer_queue, tmp_path, recipe_config,
                                                                               bare_trainer):
    config = recipe_config(tmp_path, "algorithm.apo.anchor_scope=data_source", "algorithm.apo.lambda_scale=1.0",
                           "algorithm.apo.eta_min=1.0")
    trainer = bare_trainer(config)
    reset_driver_anchors()
    keys = [f"step1-{i}" for i in range(len(UIDS))]
    metrics = {}
    batch = trainer._compute_advantage(put_batch(keys), metrics)  # verl's own V1 advantage step inside

    advantages = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])["advantages"]
    got = advantages.to_padded_tensor(0.0)[:, 0]

    width = max(LENGTHS)
    token_rewards = torch.zeros(len(UIDS), width)
    mask = torch.zeros(len(UIDS), width)
    for i, (reward, n) in enumerate(zip(REWARDS, LENGTHS)):
        token_rewards[i, n - 1] = reward
        mask[i, :n] = 1
    expected, expected_metrics = compute_apo_advantage(
        token_rewards, mask, np.array(UIDS, dtype=object), trainer.runtime("apo").settings, AnchorBook(),
        np.array(SOURCES))
    torch.testing.assert_close(got, expected[:, 0])
    assert metrics["apo/anchor/easy"] == 0.75 and metrics["apo/anchor/hard"] == 0.25
    assert {k: v for k, v in metrics.items() if k.startswith("apo/")} == expected_metrics
    assert len(batch) == len(UIDS)

    # The step's metrics dict is what verl's fit() hands to its Tracking logger.
    log_path = tmp_path / "metrics.jsonl"
    os.environ["VERL_FILE_LOGGER_PATH"] = str(log_path)
    try:
        tracker = Tracking(project_name="recipe_apo", experiment_name="test", default_backend=["file"])
        tracker.log(data=metrics, step=1)
        tracker.finish()
    finally:
        del os.environ["VERL_FILE_LOGGER_PATH"]
    logged = json.loads(log_path.read_text().splitlines()[0])
    assert logged["step"] == 1 and logged["data"]["apo/anchor/hard"] == 0.25
    reset_driver_anchors()


def test_global_scope_step_adds_the_global_anchor_metrics(transfer_queue, tmp_path, recipe_config, bare_trainer):
    trainer = bare_trainer(recipe_config(tmp_path, "algorithm.apo.anchor_init=0.5"))
    reset_driver_anchors()
    metrics = {}
    trainer._compute_advantage(put_batch([f"step2-{i}" for i in range(len(UIDS))]), metrics)
    assert metrics["apo/batch_success"] == 0.5 and metrics["apo/anchor"] == 0.5
    assert driver_anchors().anchor().steps == 1
    reset_driver_anchors()


def test_codapo_step_gets_the_old_log_probs_and_the_zero_variance_scale_then_resamples_also_after_a_resume(
        transfer_queue, tmp_path, monkeypatch, recipe_config, bare_trainer):
    """Groups e1 [1, 1] and h2 [0, 0] are dead; e2 and h1 are half right with old mean log-probs -0.3/-0.4 and
    -0.5/-0.6. Worked by hand: w = exp(group mean) * 1 + 0.1, A = +-0.5 / (sqrt(0.5) + 1e-6), and token-mean's
    zero-variance scale T / T_live = 22 / 12. Then step 2's prompts, in this run and in a run resumed from step
    1's checkpoint (the whole loop runs the pair in one run: tests/vllm/test_codapo_pair.py)."""
    from verl.utils import tensordict_utils as tu

    config = recipe_config(tmp_path, "algorithm.zero_variance=exclude", "data.train_batch_size=4", method="codapo")
    trainer = bare_trainer(config)
    prompts = tu.get_tensordict({"uid": np.array(["e1", "e2", "h1", "h2"], dtype=object),
                                 "data_source": np.array(["easy", "easy", "hard", "hard"], dtype=object),
                                 "raw_prompt": np.array(["q-e1", "q-e2", "q-h1", "q-h2"], dtype=object)})
    monkeypatch.setattr(PPOTrainerSync, "_next_train_batch", lambda self, num_prompts=None: prompts)
    trainer.global_steps = 1
    assert trainer._next_train_batch() is prompts  # an odd step reads the loader
    keys = [f"codapo-{i}" for i in range(len(UIDS))]
    metrics = {}
    trainer._compute_advantage(put_batch(keys, [-0.1 * (i + 1) for i in range(len(UIDS))]), metrics)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])["advantages"]
    w_e2, w_h1 = math.exp(-0.35) + 0.1, math.exp(-0.55) + 0.1
    a = 0.5 / (math.sqrt(0.5) + 1e-6) * 22 / 12
    expected = [0.0, 0.0, a * w_e2, -a * w_e2, a * w_h1, -a * w_h1, 0.0, 0.0]
    padded = got.to_padded_tensor(0.0)
    for row, (value, length) in enumerate(zip(expected, LENGTHS)):
        torch.testing.assert_close(padded[row, :length], torch.full((length,), value), rtol=1e-5, atol=1e-6)
    assert metrics["zero_variance/scale"] == pytest.approx(22 / 12)
    assert metrics["codapo/weight_mean"] == pytest.approx((0.1 + w_e2 + w_h1 + 0.1) / 4)
    # Step 1's checkpoint keeps the pair's prompts (before verl's own save, which marks the folder latest).
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: None)
    trainer._save_checkpoint()
    # Step 2: the 0.75 quantile of [0.1, 0.805, 0.677, 0.1] is 0.709: e2 alone, 4 times, fresh uids.
    trainer.global_steps = 2
    second = trainer._next_train_batch()
    assert list(second["raw_prompt"]) == ["q-e2"] * 4 and list(second["data_source"]) == ["easy"] * 4
    assert len(set(second["uid"])) == 4 and "e2" not in set(second["uid"])
    assert tu.get_non_tensor_data(second, "global_steps", None) == 2
    # A new run resumed from step 1's folder, in the middle of the pair: step 2 on the same kept prompts, and the
    # dataloader untouched.
    resumed = bare_trainer(recipe_config(tmp_path, "algorithm.zero_variance=exclude", "data.train_batch_size=4",
                                         "trainer.resume_mode=resume_path",
                                         f"trainer.resume_from_path={tmp_path}/ckpt/global_step_1", method="codapo"))
    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", lambda self: setattr(self, "global_steps", 1))

    def no_loader(self, num_prompts=None):
        raise AssertionError("the even step of a pair read the dataloader")

    monkeypatch.setattr(PPOTrainerSync, "_next_train_batch", no_loader)
    resumed._load_checkpoint()
    resumed.global_steps = 2
    again = resumed._next_train_batch()
    assert list(again["raw_prompt"]) == ["q-e2"] * 4 and list(again["data_source"]) == ["easy"] * 4
    assert len(set(again["uid"])) == 4 and not set(again["uid"]) & (set(second["uid"]) | {"e2"})


def test_init_keeps_verls_sync_mode_and_starts_a_fresh_anchor(tmp_path, monkeypatch, recipe_config):
    seen = {}
    monkeypatch.setattr(PPOTrainerSync, "__init__",
                        lambda self, config: seen.setdefault("mode", config.trainer.v1.trainer_mode))
    driver_anchors(init=0.7).anchor()
    trainer = RecipeSyncTrainer(recipe_config(tmp_path))
    assert seen["mode"] == "sync" and trainer.runtime("apo") is not None
    assert driver_anchors().anchor().value is None  # the previous run's anchor is gone


def test_checkpoint_save_writes_the_anchor_before_verl_marks_the_folder_latest(tmp_path, monkeypatch, recipe_config,
                                                                              bare_trainer):
    trainer = bare_trainer(recipe_config(tmp_path))
    trainer.global_steps = 7
    state_file = tmp_path / "ckpt" / "global_step_7" / STATE_FILE
    seen = {}
    monkeypatch.setattr(PPOTrainerSync, "_save_checkpoint", lambda self: seen.setdefault("exists", state_file.exists()))
    trainer.runtime("apo").book = AnchorBook(init=0.3)  # the run's anchors are its runtime's
    trainer.runtime("apo").book.anchor()
    trainer._save_checkpoint()
    assert seen["exists"] is True
    assert json.loads(state_file.read_text())["anchors"]["global"]["value"] == 0.3

    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("7")
    reset_driver_anchors()
    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", lambda self: None)
    trainer._load_checkpoint()
    assert driver_anchors().anchor().value == 0.3
    reset_driver_anchors()


def test_node_check_passes_where_the_plugin_is_installed(transfer_queue):
    """Also the plugin's registration in a Ray worker by verl's entry point alone: the probe is shipped by value
    (the worker imports nothing of recipe_apo) and the worker's environment, the driver's, names no plugin module."""
    assert not any(key.startswith("VERL_USE_EXTERNAL") for key in os.environ)
    reports = check_recipe_on_every_node(timeout_s=120)
    assert len(reports) == 1 and reports[0]["estimator"] and reports[0]["loss"] and reports[0]["missing"] == []


def test_node_check_names_a_node_without_the_plugin(transfer_queue, monkeypatch):
    # The probe's worker started with VERL_USE_EXTERNAL_PLUGINS=none stands for a node where the entry point is
    # missing (Ray starts a worker of its own for a task with its own runtime_env).
    import ray

    from recipe_apo.integration import cluster
    from recipe_apo.integration.errors import NodeCheckError

    remote = ray.remote
    monkeypatch.setattr(cluster.ray, "remote", lambda **options: remote(
        **options, runtime_env={"env_vars": {"VERL_USE_EXTERNAL_PLUGINS": "none"}}))
    with pytest.raises(NodeCheckError) as info:
        check_recipe_on_every_node(timeout_s=120)
    message = str(info.value)
    assert message.startswith("recipe-apo: the recipe's estimators/losses are not registered on Ray node(s) ")
    from recipe_apo.methods import catalog

    # Every name the methods register, estimators first, in catalog order.
    missing = [f"estimator {name}" for name in catalog.estimators()] + [f"loss {name}" for name in catalog.losses()]
    assert f"(missing {', '.join(missing)})" in message and missing[0] == "estimator apo"
    assert message.endswith(cluster.INSTALL_HINT) and "\n" not in message


@pytest.mark.parametrize("broken", ["missing", "corrupt"])
def test_a_codapo_resume_without_its_kept_prompts_is_said_as_one_line_naming_the_file_and_the_way_out(
        tmp_path, monkeypatch, capsys, broken, recipe_config, bare_trainer):
    """The trainer's restore of an odd step whose codapo_state.json is missing or corrupt, raised in the task
    runner and carried through Ray's wrappers as ``python -m recipe_apo.main`` meets it: exit 1, one last line."""
    import verl.trainer.main_ppo as main_ppo
    from ray.exceptions import RayTaskError

    from recipe_apo import main as recipe_main
    from recipe_apo.methods.codapo.runtime import ResamplingStateError

    codapo_state = "codapo_state.json"

    config = recipe_config(tmp_path, "trainer.resume_mode=resume_path",
                           f"trainer.resume_from_path={tmp_path}/ckpt/global_step_3", method="codapo")
    folder = tmp_path / "ckpt" / "global_step_3"
    folder.mkdir(parents=True)
    if broken == "corrupt":
        (folder / codapo_state).write_bytes(b"PK\x03\x04 not a checkpoint\n")
    trainer = bare_trainer(config)
    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", lambda self: setattr(self, "global_steps", 3))
    with pytest.raises(ResamplingStateError) as info:
        trainer._load_checkpoint()
    message = str(info.value)
    assert message.startswith(f"cannot resume CoDaPO's kept prompts from {folder / codapo_state}: ")
    assert "\n" not in message
    assert "algorithm.codapo.resample=false" in message

    remote = RayTaskError("TaskRunner.run", "Traceback ...", info.value).as_instanceof_cause()

    def failing_run_ppo(config, task_runner_class):
        raise remote

    monkeypatch.setattr(main_ppo, "run_ppo", failing_run_ppo)
    monkeypatch.setattr("verl.utils.config.validate_config", lambda **kwargs: None)
    monkeypatch.setattr("verl.utils.device.auto_set_device", lambda config: None)
    with pytest.raises(SystemExit) as exit_info:
        recipe_main.run(config)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"recipe-apo: error: {message}"


def test_the_zero_variance_hook_refuses_the_kl_penalty_in_the_reward_even_without_the_launch_checks(
        tmp_path, recipe_config, bare_trainer):
    from recipe_apo.methods.errors import MethodConfigError

    config = recipe_config(tmp_path, "algorithm.zero_variance=exclude", "algorithm.use_kl_in_reward=true",
                           method="grpo")
    with pytest.raises(MethodConfigError, match="algorithm.zero_variance=exclude with algorithm.use_kl_in_reward"):
        bare_trainer(config)


def test_the_anchor_moves_once_per_training_step_and_logs_the_steps_update(tmp_path, monkeypatch, recipe_config,
                                                                           bare_trainer):
    """verl's step() runs one advantage step per mini-batch (parameter_sync_step); the recipe's trainer opens
    the step, so the anchor moves once with the pooled success rate, and the logged apo/* anchor metrics are the
    step's update, not verl's average over the mini-batches."""
    from recipe_apo.methods.apo.estimator import apo_outcome_advantage

    config = recipe_config(tmp_path, "algorithm.apo.anchor_init=0.5", "algorithm.apo.eta_min=0.5",
                           "algorithm.apo.eta=1.0")
    trainer = bare_trainer(config)
    reset_driver_anchors()

    def verl_step(self, metrics, timing_raw):
        seen = []
        for rewards in ([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]):  # two mini-batches: y 1/4 then 3/4
            token_rewards = torch.zeros(4, 2)
            token_rewards[:, 1] = torch.tensor(rewards)
            apo_outcome_advantage(token_rewards, torch.ones(4, 2), config.algorithm,
                                  np.array(["a", "a", "b", "b"], dtype=object))
            seen.append(dict(last_result("apo").metrics))
        # verl's MetricsAggregator: the mean of the mini-batches' values.
        metrics.update({key: (seen[0][key] + seen[1][key]) / 2 for key in seen[0]})
        return "batch"

    monkeypatch.setattr(PPOTrainerSync, "step", verl_step)
    metrics = {}
    assert trainer.step(metrics, {}) == "batch"
    anchor = driver_anchors().anchor()
    # One update from 0.5 with pooled y = 4/8 and eta = max(1.0 * std([0.5]), 0.5) = 0.5: C = 0.5.
    assert anchor.steps == 1 and list(anchor.history) == [0.5, 0.5]
    assert (metrics["apo/anchor"], metrics["apo/anchor_rate"], metrics["apo/batch_success"]) == (0.5, 0.5, 0.5)
    reset_driver_anchors()


def test_the_dump_gives_each_row_verls_staleness():
    from recipe_apo.integration.rollout_dump import policy_lags

    # Step 5 trains with the policy of version 4: a row generated on version 4 is on-policy; one generated
    # across versions 2 to 3 (a partial rollout resumed after an update) lags 1 at best and 2 at worst.
    tags = [{"min_global_steps": 4, "max_global_steps": 4}, {"min_global_steps": 2, "max_global_steps": 3},
            {"is_padding": True}]
    assert policy_lags(tags, 5) == {"policy_lag": [0, 1, None], "policy_lag_worst": [0, 2, None]}
    assert policy_lags([{"is_padding": True}], 5) == {}


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_each_async_trainer_hands_verl_its_mode_and_runs_the_recipes_hooks(tmp_path, monkeypatch, recipe_config, mode):
    """The recipe's trainers for verl's asynchronous modes, one level down: verl's own class of that mode sees
    its own mode string (its async code paths key off it), and verl's hand-off points resolve to the recipe's."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    from recipe_apo.integration.trainer import RecipeColocateAsyncTrainer, RecipeHooks, RecipeSeparateAsyncTrainer

    trainer_cls, verl_cls = {"colocate_async": (RecipeColocateAsyncTrainer, PPOTrainerColocateAsync),
                             "separate_async": (RecipeSeparateAsyncTrainer, PPOTrainerSeparateAsync)}[mode]
    seen = {}
    monkeypatch.setattr(verl_cls, "__init__",
                        lambda self, config: seen.setdefault("mode", config.trainer.v1.trainer_mode))
    trainer = trainer_cls(recipe_config(tmp_path, f"trainer.v1.trainer_mode=apo_{mode}"))
    assert seen["mode"] == mode and trainer.runtime("apo") is not None
    for point in ("step", "_compute_advantage", "_save_checkpoint", "_load_checkpoint", "_next_train_batch",
                  "_log_rollout_data"):
        # verl's async classes do not override these (they come from PPOTrainer): the recipe's wrap them.
        assert getattr(trainer_cls, point) is getattr(RecipeHooks, point)
        assert point not in verl_cls.__dict__ and hasattr(PPOTrainer, point)
