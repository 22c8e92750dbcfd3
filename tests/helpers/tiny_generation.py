"""The tiny checkpoint's evaluation data and its own greedy answers, shared by the evaluation's end-to-end run
(tests/vllm/test_evaluate_generation.py) and the hf endpoint's tests (tests/e2e/test_evaluate_rehearsal.py)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from recipe_apo.cpu import reward as task_reward
from recipe_apo.cpu.make_tiny import task_rows

MAX_RESPONSE = 8  # tokens: the tiny task's answers take at most 5 (4 letters and the end token)
PROMPTS_PER_BENCHMARK = 8


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


def direct_answers(tiny, tokenizer) -> dict:
    """The checkpoint's greedy answers, and those of a random model of its config (seeded)."""
    trained = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa").eval()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(tiny, attn_implementation="sdpa")
    random = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    real, noise = greedy_responses(trained, tokenizer, ROWS), greedy_responses(random, tokenizer, ROWS)
    return {"responses": real, "scores": scores(ROWS, real), "random_scores": scores(ROWS, noise)}
