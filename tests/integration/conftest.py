"""The recipe's trainer one level below the whole loop: its config, the trainer object without verl's worker
groups, and a local Ray with TransferQueue holding a step's rows (``test_trainer.py``, ``test_multi_output.py``)."""

from __future__ import annotations

import pytest


def _recipe_config(tmp_path, *overrides, method="apo"):
    from helpers.composing import compose_recipe

    return compose_recipe(f"method={method}", "actor_rollout_ref.rollout.n=2", "data.max_response_length=5",
                          "trainer.experiment_name=test", f"trainer.default_local_dir={tmp_path}/ckpt", *overrides)


def _bare_trainer(config):
    """The trainer without verl's worker groups: enough for the overridden advantage/checkpoint methods."""
    from recipe_apo.integration.trainer import RecipeSyncTrainer

    trainer = object.__new__(RecipeSyncTrainer)
    trainer.config = config
    trainer._start_runtimes(config)
    trainer.global_steps = 0
    return trainer


@pytest.fixture
def recipe_config():
    """``recipe_config(tmp_path, *overrides, method="apo")``: the recipe's composed and resolved config."""
    return _recipe_config


@pytest.fixture
def bare_trainer():
    """``bare_trainer(config)``: the recipe's trainer without verl's worker groups."""
    return _bare_trainer


@pytest.fixture(scope="package")
def transfer_queue():
    """A local Ray with TransferQueue, shared by the package's modules (tests/conftest.py, SHARED_SESSIONS: one
    xdist worker takes them together)."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({
        "enable": True, "metrics": {"enabled": False, "port": 0},
        "backend": {"storage_backend": "SimpleStorage",
                    "SimpleStorage": {"total_storage_size": 1000, "num_data_storage_units": 1}},
    }))
    yield
    tq.close()
    ray.shutdown()
