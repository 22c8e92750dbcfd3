"""``trainer.nnodes=2`` in the CPU rehearsal: two Ray nodes started on this machine (``recipe_apo.cpu.local_cluster``),
one FSDP worker each, method=apo; 2 steps with a checkpoint each, then the same command resumes to step 3. verl must
place one worker on each node, every checkpoint hold both ranks' shards and the anchor, and the resume continue the
anchor from exactly the saved state, as on one node.

The rehearsal's own ``hf`` rollout: the nodes, not the engine, are under test, and vLLM's engines cost more to
start than the hf servers. One cluster for both runs: each run is a Ray job of its own, as a user's would be.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest
from helpers.rehearsal_runs import checkpoint_root, run, runtime_state, state, tail

from recipe_apo.cpu import rehearse
from recipe_apo.cpu.local_cluster import local_cluster
from recipe_apo.methods.apo.anchor import GLOBAL_SCOPE, AnchorBook
from recipe_apo.methods.apo.settings import ApoSettings

NODES, WORKERS_PER_NODE = 2, 1
ENGINE = "hf"
ARGS = ("trainer.save_freq=1", "data.shuffle=false")
# verl's FSDP workers are Ray actors of this class, each holding one "GPU" (recipe_apo/cpu/platform.py).
FSDP_WORKER = "WorkerDict"

# Every actor the cluster ran, by job, with its node: the runs are over and their actors dead, but the cluster
# keeps the record. Token authentication as the rehearsal's driver sets it up (local_cluster.for_existing_cluster).
ACTORS = """
import json, sys, ray
from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
actors = [(a["JobID"], a["ActorClassName"], a["Address"]["NodeID"]) for a in ray._private.state.actors().values()]
print(json.dumps({"nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]], "actors": actors}))
"""


@pytest.fixture(scope="module")
def two_nodes(tiny, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("two-nodes")
    # The nodes' working folder is the runs': verl's relative checkpoint folder resolves in its workers'.
    with local_cluster(NODES, WORKERS_PER_NODE, cwd=workdir) as cluster:
        args = (*cluster.overrides(), *ARGS)
        first = run(rehearse.recipe_command(["apo"], tiny, *args, "trainer.total_training_steps=2", engine=ENGINE),
                    workdir, "first", workdir / "metrics" / "first")
        assert first.returncode == 0, tail(first)
        (experiment,) = rehearse.experiment_names(first.log)
        second = run(rehearse.recipe_command(["apo"], tiny, *args, "trainer.total_training_steps=3", engine=ENGINE),
                     workdir, "second", workdir / "metrics" / "second")
        assert second.returncode == 0, tail(second)
        query = subprocess.run([sys.executable, "-c", ACTORS, cluster.address], capture_output=True, text=True,
                               timeout=120)
        assert query.returncode == 0, query.stderr[-3000:]
    return {
        "ckpt": checkpoint_root(workdir, experiment), "cluster": json.loads(query.stdout.splitlines()[-1]),
        "metrics_first": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / "first", experiment)),
        "metrics_second": rehearse.read_metrics(rehearse.metrics_file(workdir / "metrics" / "second", experiment)),
    }


def test_each_run_trained_its_steps_on_two_nodes(two_nodes):
    assert [row["step"] for row in two_nodes["metrics_first"]] == [1, 2]
    assert [row["step"] for row in two_nodes["metrics_second"]] == [3]
    assert len(two_nodes["cluster"]["nodes"]) == NODES


def test_verl_placed_one_fsdp_worker_on_each_node_in_each_run(two_nodes):
    workers = defaultdict(list)
    for job, actor_class, node in two_nodes["cluster"]["actors"]:
        if actor_class.rsplit(".", 1)[-1] == FSDP_WORKER:  # Ray names a class defined in a function by its path
            workers[job].append(node)
    assert len(workers) == 2, sorted({actor_class for _, actor_class, _ in two_nodes["cluster"]["actors"]})
    for nodes in workers.values():
        assert sorted(nodes) == sorted(two_nodes["cluster"]["nodes"])


def test_every_checkpoint_holds_both_ranks_shards_and_the_anchor(two_nodes):
    for step in (1, 2, 3):
        folder = two_nodes["ckpt"] / f"global_step_{step}"
        for rank in range(NODES * WORKERS_PER_NODE):
            assert (folder / "actor" / f"model_world_size_{NODES * WORKERS_PER_NODE}_rank_{rank}.pt").is_file()
        saved = state(folder)
        assert saved["global_step"] == step and list(saved["anchors"]) == [GLOBAL_SCOPE]


def test_the_resume_continued_the_anchor_from_exactly_the_saved_state(two_nodes):
    """Step 3 replayed from global_step_2's state with step 3's logged success rate gives global_step_3's anchor
    bit for bit: the resumed run started from exactly the saved anchor."""
    (row,) = two_nodes["metrics_second"]
    book = AnchorBook()
    book.load_state_dict(runtime_state(two_nodes["ckpt"] / "global_step_2"))
    settings = ApoSettings()
    book.anchor(GLOBAL_SCOPE).update(row["apo/batch_success"], settings.eta, settings.eta_min, settings.history)
    assert book.state_dict()["anchors"] == state(two_nodes["ckpt"] / "global_step_3")["anchors"]
