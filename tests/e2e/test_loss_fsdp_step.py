"""The `apo` policy loss inside verl's real FSDP2 training step, on CPU.

A tiny Qwen2 (built from a config, nothing downloaded) is trained for one mini-batch by verl's own
`TrainingWorker` + `FSDPEngineWithLMHead` (strategy fsdp2, float32, SGD) with `ppo_loss`, exactly the objects
`ActorRolloutRefWorker` wires together, so the loss is reached through verl's registry, its config
plumbing (`tau_pos`/`tau_neg`/`loss_scale_factor`/`global_batch_info`) and its metric aggregation.

The step is the `apo_step` job of the single-rank run of tests/e2e/fsdp_cpu_steps.py (a subprocess: the CPU
shims set environment variables, start a process group and replace verl's platform singleton, none of which can
be undone); test_gradient_invariance.py reads the same run.
"""

from __future__ import annotations

import json
import math

import pytest

GATE_METRICS = ("actor/apo_gate_weight", "actor/apo_gate_low_share", "actor/apo_ratio_out_share", "actor/ppo_kl")


def _on_policy_loss(batch: dict) -> float:
    """(1/G) sum_i (1/L0) sum_t -(4/tau_i) sigmoid(0) A_i: the APO loss when pi_theta == pi_theta_old."""
    total = 0.0
    for adv, n in zip(batch["advantages"], batch["response_lens"]):
        tau = batch["tau_pos"] if adv > 0 else batch["tau_neg"]
        total += -(4.0 / tau) * 0.5 * adv * n / batch["l0"]
    return total / len(batch["advantages"])


def _scalar(value) -> float:
    # verl returns each metric as a list (one entry per mini-batch); there is exactly one mini-batch.
    if isinstance(value, list):
        assert len(value) == 1, value
        value = value[0]
    return float(value)


@pytest.fixture(scope="module")
def step_result(fsdp_steps) -> dict:
    return json.loads((fsdp_steps.run(1) / "result.json").read_text())["apo_step"]


def test_apo_fsdp2_step_moves_weights(step_result):
    assert step_result["n_params"] > 0
    # Weight decay is 0, so only the APO gradient can have moved them.
    for name, delta in step_result["param_deltas"].items():
        assert math.isfinite(delta) and delta > 0, (name, delta)
    assert step_result["changed_fraction"] > 0.9, step_result["changed_fraction"]
    grad_norm = _scalar(step_result["metrics"]["grad_norm"])
    assert math.isfinite(grad_norm) and grad_norm > 0


def test_apo_gate_metrics_on_first_step(step_result):
    metrics = step_result["metrics"]
    missing = [name for name in GATE_METRICS if name not in metrics]
    assert not missing, f"{missing} not in {sorted(metrics)}"
    values = {name: _scalar(metrics[name]) for name in GATE_METRICS}
    assert all(math.isfinite(v) for v in values.values()), values
    # old_log_probs came from the same weights, so r == 1 up to forward-pass noise: w(1) = 1.
    assert values["actor/apo_gate_weight"] == pytest.approx(1.0, abs=1e-4)
    assert values["actor/apo_gate_low_share"] == 0.0
    assert values["actor/apo_ratio_out_share"] == 0.0
    assert values["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-3)
    # Log-prob passes over the same weights are reproducible, so the tolerances above hide no noise.
    assert step_result["max_abs_logprob_gap"] < 1e-3


def test_apo_loss_value_is_length_normalised_over_the_mini_batch(step_result):
    # Summed over the two micro-batches, the loss must equal the closed form with 1/L0 and 1/G for the
    # whole mini-batch: this is what loss_scale_factor and verl's global_batch_info deliver.
    batch = step_result["batch"]
    # The batch's padded width (its longest response) is below L0: dividing by the width would show.
    assert max(batch["response_lens"]) < batch["l0"]
    expected = _on_policy_loss(batch)
    assert _scalar(step_result["metrics"]["actor/pg_loss"]) == pytest.approx(expected, rel=1e-3, abs=1e-5)
    assert _scalar(step_result["metrics"]["loss"]) == pytest.approx(expected, rel=1e-3, abs=1e-5)


def test_apo_step_lowers_the_apo_loss(step_result):
    # One SGD step along the APO gradient must lower the APO objective on the same batch.
    assert step_result["apo_loss_after"] < step_result["apo_loss_before"], step_result
