"""The task run on each Ray node by ``recipe_apo.integration.cluster``: imports verl the way verl's workers do,
nothing else, and says which of the given names verl's registries lack."""


def probe(estimators=("apo",), losses=("apo",)) -> dict:
    import socket

    report = {"host": socket.gethostname(), "estimator": False, "loss": False, "missing": [], "error": None}
    try:
        import verl  # noqa: F401  (loads the verl.plugins entry points, as in every verl worker)
        from verl.trainer.ppo import core_algos

        missing = [f"estimator {n}" for n in estimators if n not in core_algos.ADV_ESTIMATOR_REGISTRY]
        missing += [f"loss {n}" for n in losses if n not in core_algos.POLICY_LOSS_REGISTRY]
        report["missing"] = missing
        report["estimator"] = not any(m.startswith("estimator ") for m in missing)
        report["loss"] = not any(m.startswith("loss ") for m in missing)
    except Exception as exc:  # report, do not raise: the driver names every failing node at once
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report
