"""The task run on each Ray node by ``recipe_apo.cluster``: imports verl the way verl's workers do, nothing else."""


def probe() -> dict:
    import socket

    report = {"host": socket.gethostname(), "estimator": False, "loss": False, "error": None}
    try:
        import verl  # noqa: F401  (loads the verl.plugins entry points, as in every verl worker)
        from verl.trainer.ppo import core_algos

        report["estimator"] = "apo" in core_algos.ADV_ESTIMATOR_REGISTRY
        report["loss"] = "apo" in core_algos.POLICY_LOSS_REGISTRY
    except Exception as exc:  # report, do not raise: the driver names every failing node at once
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report
