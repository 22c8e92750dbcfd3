"""scripts/evaluate.py end to end on a CPU: ``scripts/evaluate.py --model <tiny checkpoint> --greedy`` starts verl's
own ``python -m verl.trainer.main_generation_server`` (its Ray cluster, a standalone ``hf`` replica with verl's
``CheckpointEngineWorker``, the server's chat-completions endpoint over HTTP), then scores with the tiny task's
reward. Its per-problem scores must be the checkpoint's own greedy answers, computed here with plain
transformers, and not a random model's: generating with verl's default ``load_format=dummy`` would score as
random weights do. About a minute on 2 cores, mostly Ray and its workers starting: here rather than in tests/e2e
for make test's time budget (the hf backend needs no vLLM); the endpoint's own tests stay in make test
(tests/e2e/test_evaluate_rehearsal.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers.paths import ROOT
from helpers.rehearsal_runs import RUN_TIMEOUT_S
from helpers.tiny_generation import BENCHMARKS, MAX_RESPONSE, ROWS, direct_answers
from transformers import AutoTokenizer

from recipe_apo.cpu import rehearse

# What the CPU needs on verl's generation command beyond rollout.name (conf/rehearsal/cpu.yaml, cpu/checks.py):
# verl's default attention is flash_attention_2, which has no CPU kernel (the hf server always computes in fp32).
CPU_GENERATION = ("actor_rollout_ref.rollout.name=hf",
                  "+actor_rollout_ref.model.override_config.attn_implementation=sdpa")


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
