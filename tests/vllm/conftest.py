"""Whole-loop tests with verl's own vLLM rollout (``actor_rollout_ref.rollout.name=vllm``) on vLLM's CPU build:
``make test-vllm`` runs them in ``.venv-vllm``; ``make test`` (no vLLM installed) does not collect this folder.

Each module is one or two real ``python -m recipe_apo.main ... rehearsal=cpu actor_rollout_ref.rollout.name=vllm``
runs on the tiny model: verl's ``vLLMReplica`` and ``vLLMHttpServer``, vLLM's engine core and worker processes,
its sampler and log-probs, and the weight transport from the FSDP actor into vLLM after every update. About 100 s
a Ray session on 2 cores (each of six processes imports vLLM), so the modules combine what they check.
``test_two_nodes.py`` (``trainer.nnodes=2`` on two local Ray nodes) generates with the ``hf`` backend: the nodes,
not the engine, are under test there, and it is here for ``make test``'s time budget, as are
``test_agentic_async_apo.py`` (partial rollouts need the ``hf`` backend's pacing), ``test_codapo_pair.py``
(CoDaPO's pair on 2 workers with the ``hf`` backend), ``test_r2po.py`` (R2PO on both engines) and
``test_plain_verl.py``
(README's plain ``verl.trainer.main_ppo`` command, with its own vLLM rollout), ``test_agpo.py`` (AGPO's
train, checkpoint and resume on the ``hf`` backend), ``test_agpo_dual_hf.py`` (AGPO's dual feedback on the
``hf`` backend) and ``test_evaluate_generation.py`` (scripts/evaluate.py
through verl's main_generation_server on the ``hf`` backend).
"""

from __future__ import annotations

import pytest

# Longest first, so that make test-vllm's two xdist workers end close together (tests/conftest.py's rule).
LONGEST_FIRST = ("test_real.py", "test_baselines.py", "test_r2po.py",
                 "test_codapo_pair.py", "test_async_data_parallel.py",
                 "test_apo_sync.py", "test_agpo_dual.py", "test_agpo.py", "test_agpo_dual_hf.py", "test_plain_verl.py",
                 "test_two_nodes.py",
                 "test_agentic_async_apo.py", "test_evaluate_generation.py", "test_dead_engine.py")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    for item in items:
        if "/vllm/" in str(item.path):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.vllm)
    items.sort(key=lambda item: rank(item) if "/vllm/" in str(item.path) else -1)


@pytest.fixture(scope="module")
def tiny(tiny_task):
    return tiny_task
