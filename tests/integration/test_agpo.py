"""method=agpo_dual in verl's loop, what runs without Ray: its launch checks, the agent loop it samples through,
the probe's grouping, the loss-column wrapper (its checkpointed state: test_state_files.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.composing import compose_recipe
from omegaconf import OmegaConf, open_dict

from recipe_apo.integration.modes import recipe_mode
from recipe_apo.integration.sampling import AGENT_LOOPS
from recipe_apo.integration.sampling import NAME as SAMPLING_LOOP
from recipe_apo.integration.sampling import TARGET as SAMPLING_TARGET
from recipe_apo.integration.validation import RecipeConfigError, route_agent_loops, validate_recipe_config
from recipe_apo.integration.verl_access import by_prompt
from recipe_apo.methods.agpo_dual.vote_keys import VoteKeyError, load_vote_key, math_vote_key
from recipe_apo.methods.errors import MethodStateError

BASE = ("method=agpo_dual", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8")
# separate_async's own rollout pool, which its checks (before AGPO's) ask for.
POOL = ("actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=8",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl")


def launch(*overrides: str, route: bool = True):
    config = compose_recipe(*BASE, *overrides, resolve=False)
    with open_dict(config):
        config.trainer.v1.trainer_mode = recipe_mode(config.trainer.v1.get("trainer_mode", "sync"))
    if route:
        route_agent_loops(config)
    return config


def refusal(*overrides: str, route: bool = True) -> str:
    with pytest.raises(RecipeConfigError) as info:
        validate_recipe_config(launch(*overrides, route=route))
    assert "\n" not in str(info.value)
    return str(info.value)


def test_the_preset_passes_in_sync_mode_with_the_recipes_agent_loops():
    config = launch()
    assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path == AGENT_LOOPS
    validate_recipe_config(config)
    entries = OmegaConf.load(AGENT_LOOPS)
    assert [(e.name, e._target_) for e in entries] == [(SAMPLING_LOOP, SAMPLING_TARGET)]
    rehearsal_loops = OmegaConf.load(AGENT_LOOPS.replace("integration", "cpu"))
    assert (SAMPLING_LOOP, SAMPLING_TARGET) in [(e.name, e._target_) for e in rehearsal_loops]


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_the_async_modes_are_refused_with_the_reason(mode):
    assert refusal(f"trainer.v1.trainer_mode={mode}", *POOL) == (
        f"method=agpo_dual with trainer.v1.trainer_mode={mode}: AGPO probes a step's prompts and sets their "
        "temperatures before their training generation, but verl's asynchronous trainers generate prompts ahead of "
        "their step, across weight updates; use trainer.v1.trainer_mode=sync")


def test_what_the_loop_cannot_host_is_refused_in_one_line(tmp_path):
    assert refusal("actor_rollout_ref.rollout.temperature=0.7").startswith(
        "actor_rollout_ref.rollout.temperature=0.7 with algorithm.agpo_dual.base_temperature=1.0: "
        "method=agpo_dual needs them equal")
    assert refusal("algorithm.filter_groups.enable=true").startswith("algorithm.filter_groups.enable=true with "
                                                                     "method=agpo_dual")
    assert refusal("algorithm.rollout_correction.bypass_mode=true").startswith(
        "algorithm.rollout_correction.bypass_mode=true with method=agpo_dual: AGPO's clip reads the old policy's "
        "token entropy")
    own = tmp_path / "loops.yaml"
    own.write_text("- name: mine\n  _target_: some.Loop\n")
    assert refusal(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={own}") == (
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={own} does not register the agent loop "
        f"recipe_sampling that agpo_dual samples through: add the entry of {AGENT_LOOPS} to it")
    assert refusal("algorithm.agpo_dual.probe_samples=0") == (
        "algorithm.agpo_dual.probe_samples must be an integer in [1, 4096], got 0")
    assert refusal("+algorithm.agpo_dual.probe_sample=4").startswith(
        "unknown setting algorithm.agpo_dual.probe_sample;")
    assert refusal("algorithm.agpo_dual.vote_key=string:nothing").startswith(
        "algorithm.agpo_dual.vote_key='string:nothing' cannot be loaded (AttributeError")


def test_a_users_own_loop_file_listing_the_sampling_loop_passes(tmp_path):
    own = tmp_path / "loops.yaml"
    own.write_text(f"- name: mine\n  _target_: some.Loop\n- name: {SAMPLING_LOOP}\n  _target_: {SAMPLING_TARGET}\n")
    config = launch(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={own}")
    assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(own)
    validate_recipe_config(config)


def test_other_methods_keep_their_agent_loop_setting():
    config = compose_recipe("method=apo", "actor_rollout_ref.rollout.name=vllm", resolve=False)
    route_agent_loops(config)
    assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path is None


# ---- the probe's responses by prompt ----------------------------------------------------------------------------
def test_the_probes_responses_are_grouped_by_prompt_in_their_order():
    rows = np.array([1, 0, 1, 0, 0, 1])
    scores = np.array([1.0, 0.0, 0.5, 1.0, 0.25, 0.0])
    keys = ["a", "b", "c", "d", "e", "f"]
    grouped, keys_by_prompt = by_prompt(rows, scores, keys, 2, 3)
    assert grouped.tolist() == [[0.0, 1.0, 0.25], [1.0, 0.5, 0.0]]
    assert keys_by_prompt == [["b", "d", "e"], ["a", "c", "f"]]
    with pytest.raises(MethodStateError, match="the probe: prompt 1 of the step came back with 2 of 3 responses"):
        by_prompt(rows[:5], scores[:5], keys[:5], 2, 3)


# ---- the answer key, pluggable ----------------------------------------------------------------------------------
def test_the_vote_key_defaults_to_the_math_rule_and_loads_a_function_by_name():
    assert load_vote_key(None) is math_vote_key
    assert load_vote_key("string:capwords")("a b") == "A B"
    with pytest.raises(VoteKeyError, match="algorithm.agpo_dual.vote_key='string:nothing' cannot be loaded"):
        load_vote_key("string:nothing")
    with pytest.raises(VoteKeyError, match="returned int, not a string"):
        load_vote_key("builtins:len")  # tried on a sample response at load, before any run


@pytest.mark.parametrize("module, spec, said", [
    (None, ":f", "'module:function', both named"),
    (None, "m:", "'module:function', both named"),
    ("raise RuntimeError('broken at import')", "m:f", "cannot be loaded (RuntimeError: broken at import)"),
    ("def f(:\n", "m:f", "cannot be loaded (SyntaxError"),
    ("def f(text):\n    raise KeyError('no answer')\n", "m:f", "fails on a sample response (KeyError"),
    ("def f(text, other):\n    return text\n", "m:f", "fails on a sample response (TypeError"),
])
def test_a_vote_key_that_cannot_work_is_one_line_at_launch(tmp_path, monkeypatch, module, spec, said):
    """What would fail at the first probe, after Ray and the model have started, is refused before."""
    if module is not None:
        name = f"vote_key_case_{abs(hash(module))}"
        (tmp_path / f"{name}.py").write_text(module)
        monkeypatch.syspath_prepend(str(tmp_path))
        spec = spec.replace("m:", f"{name}:")
    with pytest.raises(VoteKeyError) as refused:
        load_vote_key(spec)
    assert said in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith(f"algorithm.agpo_dual.vote_key={spec!r}")


# ---- the loss in the actor's workers ----------------------------------------------------------------------------
def test_the_column_loss_hands_the_micro_batchs_columns_to_verls_ppo_loss(monkeypatch):
    from tensordict import TensorDict

    from recipe_apo.integration.verl_worker_access import ColumnLoss
    from recipe_apo.methods.errors import BatchInputError
    from recipe_apo.methods.loss_inputs import handed_column

    seen, column = [], "agpo_dual_clip_eps"
    monkeypatch.setattr("verl.workers.utils.losses.ppo_loss",
                        lambda config, out, data, group: seen.append((config, handed_column(column).tolist()))
                        or "loss")
    wrapper = ColumnLoss("config", [column])
    data = TensorDict({column: torch.tensor([0.1, 0.3])}, batch_size=2)
    assert wrapper({}, data) == "loss" and seen == [("config", pytest.approx([0.1, 0.3]))]
    assert handed_column(column) is None
    with pytest.raises(BatchInputError, match="the actor's micro-batch has no agpo_dual_clip_eps column"):
        wrapper({}, TensorDict({}, batch_size=2))


# ---- the sampling agent loop ------------------------------------------------------------------------------------
class RecordingLoop:
    """An inner agent loop that records how it was built and what it was asked."""

    calls: list = []

    def __init__(self, **init):
        self.init = init

    async def run(self, sampling_params, **kwargs):
        RecordingLoop.calls.append((self.init, sampling_params, kwargs))
        return "output"


def test_the_sampling_loop_runs_the_prompts_own_loop_at_its_temperature(monkeypatch):
    import asyncio

    from verl.experimental.agent_loop import agent_loop

    from recipe_apo.integration.sampling_loop import SamplingAgentLoop

    monkeypatch.setitem(agent_loop._agent_loop_registry, "recording", {"_target_": f"{__name__}.RecordingLoop"})
    loop = SamplingAgentLoop.__new__(SamplingAgentLoop)  # built by verl with its workers' objects
    loop._init = {"tokenizer": "tok"}
    loop.rollout_config = OmegaConf.create({"top_p": 0.9, "top_k": 20, "agent": {"default_agent_loop": "recording"}})
    RecordingLoop.calls = []
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    out = asyncio.run(loop.run(params, recipe_sampling_temperature=torch.tensor(1.25), recipe_agent_name="recording",
                               raw_prompt=["q"]))
    out_default = asyncio.run(loop.run(params, recipe_sampling_temperature=0.75, raw_prompt=["r"]))
    assert out == out_default == "output"
    (init, first, kwargs), (_, second, kwargs_default) = RecordingLoop.calls
    assert init == {"tokenizer": "tok"}
    assert first == {"temperature": 1.25, "top_p": 0.9, "top_k": 20, "logprobs": True}
    assert second["temperature"] == 0.75 and kwargs == {"raw_prompt": ["q"]} and kwargs_default == {"raw_prompt": ["r"]}
    assert params["temperature"] == 1.0  # the worker's shared parameters are left as they were
    with pytest.raises(ValueError, match="the prompt's agent loop 'recipe_sampling' is not a registered agent loop"):
        asyncio.run(loop.run(params, recipe_agent_name="recipe_sampling"))


# ---- settings that would switch AGPO's dual feedback off or break it -------------------------------------------
@pytest.mark.parametrize("loss_mode", ["vanilla", "apo_one_sided"])
def test_a_loss_that_turns_it_off_is_refused_under_its_name(loss_mode):
    """method=agpo_dual with another loss ran without a probe, a temperature or a clip, still named agpo_dual."""
    from recipe_apo.integration.validation import check_preset_runs

    config = launch(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}")
    with pytest.raises(RecipeConfigError) as refused:
        check_preset_runs(config, "agpo_dual")
    assert str(refused.value).startswith(f"method=agpo_dual with algorithm.adv_estimator=grpo and "
                                         f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}: these "
                                         "settings turn AGPO (dual) off")
    check_preset_runs(launch(), "agpo_dual")


def test_a_method_that_trains_on_prompts_of_its_own_is_refused_beside_it():
    assert refusal("algorithm.adv_estimator=codapo").startswith(
        "method=agpo_dual with CoDaPO (algorithm.adv_estimator=codapo): CoDaPO may train a step on prompts of its own")


@pytest.mark.parametrize("overrides, said", [
    (["algorithm.agpo_dual.base_temperature=2.0", "actor_rollout_ref.rollout.temperature=2.0"],
     "algorithm.agpo_dual.base_temperature=2.0 is outside [min_temperature, max_temperature] = [0.5, 1.5]"),
    (["actor_rollout_ref.rollout.temperature='1.0'"],
     "actor_rollout_ref.rollout.temperature='1.0' with algorithm.agpo_dual.base_temperature=1.0"),
])
def test_temperatures_that_pin_or_misread_are_refused(overrides, said):
    assert refusal(*overrides).startswith(said)
