"""scripts/evaluate.py end to end on a CPU, and the hf rollout's OpenAI endpoint it generates through.

The end-to-end test is one real run: ``scripts/evaluate.py --model <tiny checkpoint> --greedy`` starts verl's own
``python -m verl.trainer.main_generation_server`` (its Ray cluster, a standalone ``hf`` replica with verl's
``CheckpointEngineWorker``, the server's chat-completions endpoint over HTTP), then scores with the tiny task's
reward. Its per-problem scores must be the checkpoint's own greedy answers, computed here with plain
transformers, and not a random model's: generating with verl's default ``load_format=dummy`` would score as
random weights do. About a minute on 2 cores, mostly Ray and its workers starting.

The endpoint's tests run the server in this process, without Ray, over real HTTP.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pandas as pd
import pytest
import torch
from helpers.paths import ROOT
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from recipe_apo.cpu import chat_http, hf_server, rehearse
from recipe_apo.cpu import reward as task_reward
from recipe_apo.cpu.make_tiny import task_rows

MAX_RESPONSE = 8  # tokens: the tiny task's answers take at most 5 (4 letters and the end token)
PROMPTS_PER_BENCHMARK = 8
# What the CPU needs on verl's generation command beyond rollout.name (conf/rehearsal/cpu.yaml, cpu/checks.py):
# verl's default attention is flash_attention_2, which has no CPU kernel (the hf server always computes in fp32).
CPU_GENERATION = ("actor_rollout_ref.rollout.name=hf",
                  "+actor_rollout_ref.model.override_config.attn_implementation=sdpa")
# A hung run fails its test instead of holding CI (the run takes about a minute).
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def tiny(tiny_task) -> Path:
    return tiny_task["model"]


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return AutoTokenizer.from_pretrained(tiny)


def benchmark_rows(data_source: str) -> list[dict]:
    """Val prompts of one data source, in the layout scripts/prepare_data.py writes."""
    rows = [r for r in task_rows("val", 4 * PROMPTS_PER_BENCHMARK, seed=0) if r["data_source"] == data_source]
    return [
        {
            "data_source": data_source,
            "prompt": row["prompt"],
            "reward_model": {"ground_truth": row["reward_model"]["ground_truth"]},
            "extra_info": {"index": index},
        }
        for index, row in enumerate(rows[:PROMPTS_PER_BENCHMARK])
    ]


BENCHMARKS = {"add": benchmark_rows("tiny_add"), "reverse": benchmark_rows("tiny_reverse")}
ROWS = [row for rows in BENCHMARKS.values() for row in rows]  # main_generation_server's order: file by file


def greedy_responses(model, tokenizer, rows: list[dict]) -> list[str]:
    """Each prompt alone (no padding), greedy, decoded as main_generation_server's responses are."""
    responses = []
    for row in rows:
        text = tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_RESPONSE,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        responses.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return responses


def scores(rows: list[dict], responses: list[str]) -> list[float]:
    return [task_reward.compute_score(r["data_source"], text, r["reward_model"]["ground_truth"])
            for r, text in zip(rows, responses)]


@pytest.fixture(scope="module")
def direct(tiny, tokenizer):
    """The checkpoint's greedy answers, and those of a random model of its config (seeded)."""
    trained = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa").eval()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny, attn_implementation="sdpa")
    random = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    real, noise = greedy_responses(trained, tokenizer, ROWS), greedy_responses(random, tokenizer, ROWS)
    return {"responses": real, "scores": scores(ROWS, real), "random_scores": scores(ROWS, noise)}


# ---- the end-to-end run ------------------------------------------------------------------------------------------
def evaluate_env() -> dict[str, str]:
    from recipe_apo.cpu.activate import DRIVER_ENV, ENV

    env = {**rehearse.rehearsal_env(), **ENV, **DRIVER_ENV, "TOKENIZERS_PARALLELISM": "false"}
    # main_generation_server calls ray.init() with no resources, which starts a local cluster (inside the
    # run's process group, so a timeout kills it too). Ray reads this node's resources from
    # RAY_OVERRIDE_RESOURCES: one "GPU" for verl's resource pool (the CPU platform's resource name) and, as
    # the rehearsal config declares, more CPUs than the machine has (Ray only counts them).
    env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"CPU": 16, "GPU": 1})
    env.pop("RAY_ADDRESS", None)  # never join a cluster someone else started
    return env


@pytest.fixture(scope="module")
def evaluation(tiny, tmp_path_factory):
    import openai  # noqa: F401  (in the test extra: verl's main_generation_server needs it; vLLM brings it on GPUs)
    workdir = tmp_path_factory.mktemp("evaluate")
    data_dir = workdir / "data"
    data_dir.mkdir()
    for name, rows in BENCHMARKS.items():
        pd.DataFrame(rows).to_parquet(data_dir / f"{name}.parquet", index=False)
    out = workdir / "eval"
    # --greedy: one answer per problem, which the checkpoint's own greedy decodes below must match exactly (the
    # default samples several per problem; its commands and statistics: tests/scripts/test_evaluate.py).
    command = [sys.executable, str(ROOT / "scripts" / "evaluate.py"), "--model", str(tiny), "--out-dir", str(out),
               "--data-dir", str(data_dir), "--benchmarks", ",".join(BENCHMARKS), "--ngpus", "1", "--greedy",
               "--max-prompt-length", "64", "--max-response-length", str(MAX_RESPONSE),
               "--reward-path", "pkg://recipe_apo.cpu.reward",
               *(arg for override in CPU_GENERATION for arg in ("--generation-override", override))]
    result = rehearse.run_logged(command, workdir / "evaluate.log", cwd=workdir, env=evaluate_env(),
                                 label="evaluate", say=lambda _line: None, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, "\n".join(result.log.read_text().splitlines()[-40:])
    return out, result


def test_evaluation_scores_the_checkpoints_own_greedy_answers(evaluation, direct):
    out, _ = evaluation
    rows = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
    assert [(r["benchmark"], r["index"]) for r in rows] == [(r["data_source"], r["extra_info"]["index"]) for r in ROWS]
    assert [r["score"] for r in rows] == direct["scores"]
    # Real weights, told apart from random ones: the checkpoint solves some problems and misses others.
    assert 0 < sum(direct["scores"]) < len(ROWS)
    assert sum(direct["random_scores"]) != sum(direct["scores"])


def test_generations_are_the_checkpoints_greedy_decodes(evaluation, direct):
    out, _ = evaluation
    frame = pd.read_parquet(out / "generations.parquet")
    assert [list(r) for r in frame["responses"]] == [[text] for text in direct["responses"]]


def test_the_run_generated_through_its_own_ray_cluster_and_loaded_the_checkpoint(evaluation):
    out, result = evaluation
    log = result.log.read_text()
    assert "actor_rollout_ref.rollout.load_format=auto" in log  # evaluate's command line, echoed
    assert "Started a local Ray instance" in log  # main_generation_server's ray.init, not a leftover cluster
    assert (out / "results.md").is_file()


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
