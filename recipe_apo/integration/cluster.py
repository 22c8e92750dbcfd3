"""Start-up check that every node of the Ray cluster has the recipe's estimators and losses registered.

verl's workers on another node import verl from that node's Python environment. Without the plugin there, an
`apo` or `codapo` run fails only when the first batch reaches the estimator or the actor's loss, after the model
load and the rollout. This check runs one tiny task on every alive node before training starts.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from recipe_apo.integration import node_probe as _node_probe
from recipe_apo.integration.errors import NodeCheckError

# Shipped by value, so that a node unpickling the probe does not import recipe_apo (which would register APO
# by itself and hide a missing entry point).
ray.cloudpickle.register_pickle_by_value(_node_probe)

INSTALL_HINT = (
    "install recipe-apo in every node's environment, or ship it with Ray's runtime_env "
    "(+ray_kwargs.ray_init.runtime_env.py_modules or pip)"
)


def check_recipe_on_every_node(timeout_s: float = 300.0) -> list[dict]:
    """Probe every alive node; raise ``NodeCheckError`` naming the nodes where any of the plugin's
    estimators or losses is not registered."""
    from recipe_apo.plugin import ESTIMATORS, LOSSES

    probe = ray.remote(num_cpus=0)(_node_probe.probe)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False))
        .remote(ESTIMATORS, LOSSES)
        for node in nodes
    ]
    ready, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if late:
        silent = [node.get("NodeManagerHostname", node["NodeID"]) for node, ref in zip(nodes, refs) if ref in late]
        raise NodeCheckError(
            f"recipe-apo: Ray node(s) {', '.join(silent)} did not answer the start-up check within {timeout_s:.0f} s"
        )
    reports = ray.get(ready)
    missing = [r for r in reports if not (r["estimator"] and r["loss"])]
    if missing:
        where = "; ".join(f"{r['host']} ({r['error'] or 'missing ' + ', '.join(r['missing'])})" for r in missing)
        raise NodeCheckError(f"recipe-apo: the recipe's estimators/losses are not registered on Ray node(s) {where}: "
                             f"{INSTALL_HINT}")
    return reports
