"""The rehearsal's two-turn agent loop without Ray: built from its yaml as verl's agent-loop worker builds it
(``hydra.utils.instantiate`` with the worker's arguments), generating through the rehearsal's hf server object
on the tiny model, greedy so the three output modes can be compared token for token."""

from __future__ import annotations

import asyncio

import hydra
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap
from verl.utils.dataset.rl_dataset import RLHFDataset

from recipe_apo.cpu import agent_loops
from recipe_apo.cpu.hf_server import HFGenerationServer
from recipe_apo.cpu.rehearse import tiny_overrides

PROMPT = [{"role": "user", "content": "3+4="}]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def composed(tiny, response_length):
    with initialize_config_module(config_module="recipe_apo.conf", version_base=None):
        config = compose("apo_trainer", overrides=[
            "method=apo", "rehearsal=cpu", *tiny_overrides(tiny), f"data.max_response_length={response_length}",
            "data.max_prompt_length=64", "actor_rollout_ref.rollout.load_format=auto",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loops.CONFIG_PATH}"])
    OmegaConf.resolve(config)
    return config


class ServerManager:
    """verl's ``LLMServerClient.generate`` keyword interface over one hf server object, counting the calls."""

    def __init__(self, server):
        self.server, self.calls = server, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, len(prompt_ids), sampling_params["max_tokens"]))
        return await self.server.generate(prompt_ids=prompt_ids, sampling_params=sampling_params,
                                          request_id=request_id, **kwargs)


@pytest.fixture(scope="module")
def events():
    """One event loop for the module, as an agent-loop worker has: the server's batching queue lives on it."""
    events = asyncio.new_event_loop()
    yield events
    events.close()


@pytest.fixture(scope="module")
def setup(tiny_task, events):
    config = composed(tiny_task, 48)
    server = HFGenerationServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model)
    return config, server, events


def loop(setup, name):
    """The loop as ``AgentLoopWorker._run_agent_loop`` instantiates it (on the worker's event loop), from the
    yaml's registry entry."""
    config, server, events = setup
    entries = {entry.name: entry for entry in OmegaConf.load(config.actor_rollout_ref.rollout.agent
                                                             .agent_loop_config_path)}
    manager = ServerManager(server)

    async def build():
        return hydra.utils.instantiate(
            config=entries[name], trainer_config=DictConfigWrap(config=config), server_manager=manager,
            tokenizer=server.model_config.tokenizer, processor=None, hf_model_type="qwen2", dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))

    return (events.run_until_complete(build()), events), manager


def run(instance, session_id):
    instance, events = instance
    return events.run_until_complete(instance.run(dict(GREEDY), raw_prompt=PROMPT, session_id=session_id))


def test_one_output_holds_both_turns_with_the_user_turn_masked(setup):
    config, server, _ = setup
    instance, manager = loop(setup, "recipe_two_turn")
    out = run(instance, 0)
    assert isinstance(out, AgentLoopOutput) and out.num_turns == 4
    tokenizer = server.model_config.tokenizer
    assert tokenizer.decode(out.prompt_ids) == "<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) <= 48
    # 1 .. 1, 0 .. 0, 1 .. 1: the two assistant turns around the user turn.
    mask = out.response_mask
    first_end, second_start = mask.index(0), len(mask) - mask[::-1].index(0)
    assert set(mask[:first_end]) == {1} and set(mask[first_end:second_start]) == {0} and set(mask[second_start:]) == {1}
    user_turn = tokenizer.decode(out.response_ids[first_end:second_start])
    assert user_turn.endswith("<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n")
    assert all(lp == 0.0 for lp in out.response_logprobs[first_end:second_start])
    assert all(lp < 0.0 for lp in out.response_logprobs[second_start:]) or len(mask) == second_start
    # Both turns to one server (one request id); turn 1 gets a third of the budget, turn 2 what is left.
    (id1, prompt1, budget1), (id2, prompt2, budget2) = manager.calls
    assert id1 == id2 and budget1 == 16 and prompt1 == len(out.prompt_ids)
    assert prompt2 == len(out.prompt_ids) + second_start and budget2 == 48 - second_start


def test_per_turn_outputs_are_the_same_conversation_cut_at_the_second_turn(setup):
    whole = run(loop(setup, "recipe_two_turn")[0], 0)
    first, second = run(loop(setup, "recipe_two_turn_per_turn")[0], 0)
    assert first.prompt_ids == whole.prompt_ids and first.response_mask == [1] * len(first.response_ids)
    assert second.response_mask == [1] * len(second.response_ids) and (first.num_turns, second.num_turns) == (2, 4)
    # The second output's prompt is the first turn and the user turn after the prompt: greedy, token for token.
    assert second.prompt_ids + second.response_ids == whole.prompt_ids + whole.response_ids
    assert first.response_ids == whole.response_ids[:len(first.response_ids)]
    assert first.response_logprobs == whole.response_logprobs[:len(first.response_ids)]


def test_alternate_gives_odd_sessions_one_output_per_turn_and_even_sessions_one(setup):
    instance, _ = loop(setup, "recipe_two_turn_alternate")
    assert isinstance(run(instance, 0), AgentLoopOutput) and isinstance(run(instance, 2), AgentLoopOutput)
    assert [len(run(instance, session)) for session in (1, 3)] == [2, 2]


def test_a_budget_without_room_for_the_second_turn_is_said_in_one_line(tiny_task, events):
    config = composed(tiny_task, 6)
    server = HFGenerationServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model)
    instance, _ = loop((config, server, events), "recipe_two_turn")
    with pytest.raises(agent_loops.AgentLoopSettingError, match=r"^data.max_response_length=6: turn 1 and the user "
                                                                r"turn took \d+ tokens, none is left for turn 2"):
        run(instance, 0)
    with pytest.raises(agent_loops.AgentLoopSettingError, match="outputs='three' is not one of one, per_turn"):
        agent_loops.TwoTurnAgentLoop(trainer_config=DictConfigWrap(config=config), server_manager=None,
                                     tokenizer=server.model_config.tokenizer, processor=None,
                                     dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                                     outputs="three")


def test_the_last_turn_score_reads_the_answer_after_the_last_assistant_header():
    text = "9\nuser\n3+4=\nassistant\n7"  # a one-output conversation decoded without special tokens
    assert agent_loops.last_turn_score("tiny_add", text, "7") == 1.0
    assert agent_loops.last_turn_score("tiny_add", "9\nuser\n3+4=\nassistant\n9", "7") == 0.0
    assert agent_loops.last_turn_score("tiny_add", "7", "7") == 1.0  # a per-turn output: the turn alone
