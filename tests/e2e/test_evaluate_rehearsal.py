"""The hf rollout's OpenAI endpoint that scripts/evaluate.py generates through, in this process, without Ray, over
real HTTP; and the score stage's reward functions. The whole evaluation through verl's main_generation_server (a
Ray session) is tests/vllm/test_evaluate_generation.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pandas as pd
import pytest
from helpers.paths import ROOT
from helpers.tiny_generation import BENCHMARKS, MAX_RESPONSE, ROWS, direct_answers
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from recipe_apo.cpu import chat_http, hf_server
from recipe_apo.cpu import reward as task_reward


@pytest.fixture(scope="module")
def tiny(tiny_task) -> Path:
    return tiny_task["model"]


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return AutoTokenizer.from_pretrained(tiny)


@pytest.fixture(scope="module")
def direct(tiny, tokenizer):
    """The checkpoint's greedy answers, and those of a random model of its config (seeded)."""
    return direct_answers(tiny, tokenizer)


# ---- the endpoint, without Ray ------------------------------------------------------------------------------------
def test_a_main_generation_server_request_maps_to_the_servers_sampling_settings():
    request = chat_http.parse_request({"model": "/m", "messages": [{"role": "user", "content": "3+4="}],
                                       "temperature": 0.0, "top_p": 1.0, "max_tokens": 8})
    assert request.model == "/m" and request.messages == [{"role": "user", "content": "3+4="}]
    assert request.sampling_params == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 8}
    assert chat_http.parse_request({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 3,
                                    "top_k": 5}).sampling_params == {"max_tokens": 3, "top_k": 5}
    assert set(chat_http.SAMPLING_FROM_REQUEST.values()) <= hf_server.SAMPLING_KEYS


MESSAGES = [{"role": "user", "content": "3+4="}]


@pytest.mark.parametrize("body, param, message", [
    ({"messages": MESSAGES, "n": 2, "stream": True}, "n", "does not support request parameter\\(s\\) n, stream$"),
    ({"messages": MESSAGES, "logprobs": True}, "logprobs", "request parameter\\(s\\) logprobs$"),
    ({"messages": []}, "messages", "messages must be a non-empty list"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}, "messages", "text content"),
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature", "temperature must be a number"),
    ({"messages": MESSAGES, "max_tokens": 2, "max_completion_tokens": 2}, "max_completion_tokens", "not both"),
    (["not", "an", "object"], None, "JSON object"),
])
def test_requests_the_endpoint_cannot_honour_are_refused_naming_the_key(body, param, message):
    with pytest.raises(chat_http.BadChatRequest, match=message) as caught:
        chat_http.parse_request(body)
    assert caught.value.param == param


def in_process_server(model_path: Path) -> hf_server.HFGenerationServer:
    """The server actor's class, instantiated here; the rollout settings it reads, as main_generation_server's
    command gives them."""
    config = SimpleNamespace(load_format="auto", response_length=MAX_RESPONSE, prompt_length=64, max_model_len=None,
                             seed=0)
    model_config = OmegaConf.create({"path": str(model_path), "override_config": {"attn_implementation": "sdpa"}})
    return hf_server.HFGenerationServer(config, model_config)


async def post(session: aiohttp.ClientSession, address: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, str) else json.dumps(body)
    async with session.post(f"http://{address}{chat_http.ROUTE}", data=data,
                            headers={"Content-Type": "application/json"}) as response:
        return response.status, await response.json()


def test_concurrent_chat_requests_batch_and_answer_as_openai_chat_completions(tiny, direct, monkeypatch):
    import openai.types.chat as openai_chat

    server = in_process_server(tiny)
    batch_sizes: list[int] = []
    all_arrived = threading.Event()
    real_generate_batch = hf_server.generate_batch

    def generate_batch(model, prompts, *args):
        # Hold the first batch until every request is in: the rest must then share one batch, whatever the
        # timing of their arrival.
        if not batch_sizes:
            all_arrived.wait(timeout=60)
        batch_sizes.append(len(prompts))
        return real_generate_batch(model, prompts, *args)

    monkeypatch.setattr(hf_server, "generate_batch", generate_batch)
    arrived = 0

    async def complete(body):
        nonlocal arrived
        arrived += 1
        if arrived == len(ROWS):
            all_arrived.set()
        return await server.chat_completion(body)

    async def scenario():
        runner, address = await chat_http.serve(complete, "127.0.0.1")
        try:
            async with aiohttp.ClientSession() as session:
                requests = [{"model": str(tiny), "messages": list(r["prompt"]), "temperature": 0.0, "top_p": 1.0,
                             "max_tokens": MAX_RESPONSE} for r in ROWS]
                return await asyncio.gather(*(post(session, address, body) for body in requests))
        finally:
            await runner.cleanup()

    answers = asyncio.run(scenario())
    assert sum(batch_sizes) == len(ROWS) and len(batch_sizes) <= 2
    assert all(status == 200 for status, _ in answers)
    completions = [openai_chat.ChatCompletion(**body) for _, body in answers]
    assert [c.choices[0].message.content for c in completions] == direct["responses"]
    for completion in completions:
        choice = completion.choices[0]
        assert completion.object == "chat.completion" and completion.model == str(tiny)
        assert choice.index == 0 and choice.message.role == "assistant"
        # The tiny model ends its answers: "stop" at the end token, "length" at the token cap.
        assert choice.finish_reason == ("stop" if completion.usage.completion_tokens < MAX_RESPONSE else "length")
        assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert len({c.id for c in completions}) == len(completions)


def test_refusals_reach_the_client_as_http_400_with_the_message(tiny):
    server = in_process_server(tiny)

    async def scenario():
        address = await server.serve_http()
        try:
            async with aiohttp.ClientSession() as session:
                return [
                    await post(session, address, {"messages": MESSAGES, "n": 2}),
                    await post(session, address, "{not json"),
                    # A prompt longer than the budget: the server's own refusal (Sampling.from_verl).
                    await post(session, address, {"messages": [{"role": "user", "content": "1+1=" * 40}]}),
                ]
        finally:
            await server._http[0].cleanup()

    (unknown, not_json, too_long) = asyncio.run(scenario())
    assert unknown == (400, {"error": {"message": "the CPU rehearsal's hf rollout does not support request "
                                       "parameter(s) n", "type": "invalid_request_error", "param": "n",
                                       "code": 400}})
    assert not_json[0] == 400 and "not JSON" in not_json[1]["error"]["message"]
    assert too_long[0] == 400 and "no room to generate" in too_long[1]["error"]["message"]


# ---- evaluate's reward option, without generating ---------------------------------------------------------------
def load_evaluate():
    spec = importlib.util.spec_from_file_location("evaluate_rehearsal_script", ROOT / "scripts" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_score_stage_takes_a_reward_function_by_file_path_as_verl_does(tmp_path):
    rows = [{**row, "responses": [row["reward_model"]["ground_truth"] if i % 2 else "wrong"]}
            for i, row in enumerate(BENCHMARKS["reverse"])]
    generations = tmp_path / "generations.parquet"
    pd.DataFrame(rows).to_parquet(generations)
    evaluate = load_evaluate()
    assert evaluate.main(["--score", str(generations), "--reward-path", task_reward.__file__]) == 0
    scored = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert [r["score"] for r in scored] == [float(i % 2) for i in range(len(rows))]
    with pytest.raises(AttributeError, match="no_such_reward"):
        evaluate.main(["--score", str(generations), "--reward-path", task_reward.__file__,
                       "--reward-name", "no_such_reward"])


def test_a_reward_function_may_return_a_dict_as_verl_allows(tmp_path):
    rows = [{**row, "responses": [row["reward_model"]["ground_truth"] if i % 2 else "wrong"]}
            for i, row in enumerate(BENCHMARKS["reverse"])]
    generations = tmp_path / "generations.parquet"
    pd.DataFrame(rows).to_parquet(generations)
    reward = tmp_path / "dict_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
                      "    return {'score': float(solution_str.strip() == ground_truth), 'acc': 0.0}\n")
    assert load_evaluate().main(["--score", str(generations), "--reward-path", str(reward)]) == 0
    scored = [json.loads(line) for line in (tmp_path / "scores.jsonl").read_text().splitlines()]
    assert [r["score"] for r in scored] == [float(i % 2) for i in range(len(rows))]
