"""The `apo` policy loss inside verl's real FSDP2 training step, on CPU.

A tiny Qwen2 (built from a config, nothing downloaded) is trained for one mini-batch by verl's own
`TrainingWorker` + `FSDPEngineWithLMHead` (strategy fsdp2) with `ppo_loss`, exactly the objects
`ActorRolloutRefWorker` wires together, so the loss is reached through verl's registry, its config
plumbing (`tau_pos`/`tau_neg`/`loss_scale_factor`/`global_batch_info`) and its metric aggregation.

The step runs in a subprocess: the CPU shims (tests/fsdp_cpu_shims.py) set environment variables,
start a process group and replace verl's platform singleton, none of which can be undone.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROMPT_LENS = [4, 3, 2, 4]
RESPONSE_LENS = [6, 4, 5, 2]
# The padded response width of the batch.
MAX_RESPONSE_LEN = 6
# L0 = data.max_response_length, larger than this batch's padded width (as for most micro-batches in a real
# run): the loss must divide by L0, not by the width verl falls back to when loss_scale_factor is unset.
L0 = 10
ADVANTAGES = [1.0, -1.0, 0.5, -0.5]
# Asymmetric so that the closed-form loss below depends on which temperature each sign gets.
TAU_POS, TAU_NEG = 1.0, 2.0
MICRO_BATCH_SIZE = 2  # two micro-batches: APO's 1/G must span the mini-batch, not each micro-batch
LR = 1e-3
RESULT_PREFIX = "APO_FSDP_RESULT "
GATE_METRICS = ("actor/apo_gate_weight", "actor/apo_gate_low_share", "actor/apo_ratio_out_share", "actor/ppo_kl")


def _on_policy_loss() -> float:
    """(1/G) sum_i (1/L0) sum_t -(4/tau_i) sigmoid(0) A_i: the APO loss when pi_theta == pi_theta_old."""
    total = 0.0
    for adv, n in zip(ADVANTAGES, RESPONSE_LENS):
        tau = TAU_POS if adv > 0 else TAU_NEG
        total += -(4.0 / tau) * 0.5 * adv * n / L0
    return total / len(ADVANTAGES)


def _scalar(value) -> float:
    # verl returns each metric as a list (one entry per mini-batch); there is exactly one mini-batch.
    if isinstance(value, list):
        assert len(value) == 1, value
        value = value[0]
    return float(value)


@pytest.fixture(scope="module")
def step_result(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("apo_fsdp_step")
    # Outer VERL_*/MASTER_* settings (VERL_PLATFORM, a launcher's rendezvous) must not steer the child, and
    # the shims assume a CPU-only process even where a GPU exists.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_", "MASTER_", "CUDA_"))}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, __file__, str(workdir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=workdir,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        pytest.fail(
            f"training subprocess failed (rc={proc.returncode})\n--- stdout ---\n{proc.stdout[-6000:]}"
            f"\n--- stderr ---\n{proc.stderr[-10000:]}"
        )
    return json.loads(lines[-1][len(RESULT_PREFIX) :])


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
    expected = _on_policy_loss()
    assert _scalar(step_result["metrics"]["actor/pg_loss"]) == pytest.approx(expected, rel=1e-3, abs=1e-5)
    assert _scalar(step_result["metrics"]["loss"]) == pytest.approx(expected, rel=1e-3, abs=1e-5)


def test_apo_step_lowers_the_apo_loss(step_result):
    # One small Adam step along the APO gradient must lower the APO objective on the same batch.
    assert step_result["apo_loss_after"] < step_result["apo_loss_before"], step_result


# --------------------------------------------------------------------------------------------------
# The subprocess. Everything below runs only as `python test_loss_fsdp_step.py WORKDIR`.
# --------------------------------------------------------------------------------------------------


def _build_tiny_model(model_dir: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    Qwen2ForCausalLM(config).save_pretrained(model_dir)


def _padded_batch():
    """A rollout batch laid out as verl's trainer holds it: left-padded prompts, right-padded responses."""
    import torch

    gen = torch.Generator().manual_seed(1)
    bsz, prompt_width = len(PROMPT_LENS), max(PROMPT_LENS)
    prompts = torch.zeros(bsz, prompt_width, dtype=torch.long)
    responses = torch.zeros(bsz, MAX_RESPONSE_LEN, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    response_mask = torch.zeros_like(responses)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        prompts[i, prompt_width - p :] = torch.randint(3, 128, (p,), generator=gen)
        prompt_mask[i, prompt_width - p :] = 1
        responses[i, :r] = torch.randint(3, 128, (r,), generator=gen)
        response_mask[i, :r] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clamp(attention_mask.cumsum(dim=1) - 1, min=0),
        "response_mask": response_mask,
    }


def _to_engine_input(tensors: dict, **meta):
    """What RayPPOTrainer does before every worker call: DataProto -> TensorDict -> no-padding layout."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    # The trainer puts the rollout temperature in meta_info; the engine divides logits by it.
    td = tu.get_tensordict(tensor_dict={k: v.clone() for k, v in tensors.items()}, non_tensor_dict={"temperature": 1.0})
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, **meta)
    return td


def _log_probs(worker, batch: dict):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    # The trainer's _compute_old_log_prob path (compute_log_prob -> TrainingWorker.infer_batch).
    td = _to_engine_input(batch, calculate_entropy=False, compute_loss=False)
    output = worker.infer_batch(td)
    return no_padding_2_padding(tu.get(output, "log_probs"), td).float()


def _full_params(module) -> dict:
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in module.named_parameters()
    }


def _child_main(workdir: Path) -> None:
    import fsdp_cpu_shims

    # Before anything imports verl.workers.engine, which resolves the device at import time.
    fsdp_cpu_shims.install()

    from functools import partial

    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import (
        FSDPActorConfig,
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        PolicyLossConfig,
        TrainingWorkerConfig,
    )
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    from recipe_apo.methods.apo_loss import compute_policy_loss_apo

    model_dir = workdir / "tiny-qwen2"
    _build_tiny_model(model_dir)
    bsz = len(PROMPT_LENS)

    model_config = HFModelConfig(
        path=str(model_dir),
        load_tokenizer=False,  # the engine only consumes token ids
        # verl defaults to flash_attention_2, which has no CPU kernel. The default remove-padding (packed)
        # layout still works: transformers' sdpa mask splits packed sequences at position_ids resets.
        override_config={"attn_implementation": "sdpa"},
    )
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",  # FSDP1 (strategy="fsdp") syncs module states, which it only does on GPU
        # What ActorRolloutRefWorker.init_model copies into the engine from the actor/rollout config:
        # fixed-size micro-batches, the same for the log-prob pass and the update, so both forwards
        # see identical inputs and the first update is exactly on-policy.
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=MICRO_BATCH_SIZE,
        infer_micro_batch_size_per_gpu=MICRO_BATCH_SIZE,
    )
    actor_config = FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_mini_batch_size=bsz,
        ppo_micro_batch_size_per_gpu=MICRO_BATCH_SIZE,
        loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=L0,
        tau_pos=TAU_POS,
        tau_neg=TAU_NEG,
        policy_loss=PolicyLossConfig(loss_mode="apo"),
        # No weight decay: any parameter movement then comes from the loss gradient alone.
        optim=FSDPOptimizerConfig(lr=LR, weight_decay=0.0),
        fsdp_config=engine_config,
    )
    actor_config.model_config = model_config

    worker = TrainingWorker(
        config=TrainingWorkerConfig(
            model_type="language_model",
            model_config=model_config,
            engine_config=actor_config.engine,
            optimizer_config=actor_config.optim,
            checkpoint_config=actor_config.checkpoint,
        )
    )
    worker.reset()
    worker.set_loss_fn(partial(ppo_loss, config=actor_config))

    batch = _padded_batch()
    response_mask = batch["response_mask"]
    advantages = torch.tensor(ADVANTAGES).unsqueeze(1) * response_mask.float()

    old_log_probs = _log_probs(worker, batch)
    # A second forward with the same weights bounds the forward-pass noise the gate sees.
    max_gap = (_log_probs(worker, batch) - old_log_probs).abs().max().item()

    before = _full_params(worker.engine.module)
    train_td = _to_engine_input(
        {**batch, "old_log_probs": old_log_probs, "advantages": advantages},
        calculate_entropy=False,
        global_batch_size=bsz,
        mini_batch_size=bsz,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    output = worker.train_mini_batch(train_td)
    metrics = tu.get(output, "metrics")
    after = _full_params(worker.engine.module)

    deltas = {name: (after[name] - before[name]).abs().max().item() for name in before}
    watched = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]

    def apo_loss(log_probs) -> float:
        loss_config = FSDPActorConfig(
            strategy="fsdp2",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=MICRO_BATCH_SIZE,
            loss_scale_factor=L0,
            tau_pos=TAU_POS,
            tau_neg=TAU_NEG,
        )
        loss, _ = compute_policy_loss_apo(
            old_log_prob=old_log_probs,
            log_prob=log_probs,
            advantages=advantages,
            response_mask=response_mask.bool(),
            loss_agg_mode="seq-mean-token-sum-norm",
            config=loss_config,
        )
        return loss.item()

    result = {
        "metrics": metrics,
        "n_params": len(before),
        "param_deltas": {name: deltas[name] for name in watched},
        "changed_fraction": sum(d > 0 for d in deltas.values()) / len(deltas),
        "max_abs_logprob_gap": max_gap,
        "apo_loss_before": apo_loss(old_log_probs),
        "apo_loss_after": apo_loss(_log_probs(worker, batch)),
    }
    print(RESULT_PREFIX + json.dumps(result, default=_jsonable), flush=True)
    torch.distributed.destroy_process_group()


def _jsonable(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]))
