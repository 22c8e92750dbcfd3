"""verl's own FSDP2 training worker on the CPU, one rank per process: the child side of tests/e2e's FSDP tests.

``python fsdp_cpu_steps.py OUT RANK WORLD_SIZE PORT`` builds a tiny Qwen2 (from a config, nothing downloaded),
verl's ``TrainingWorker`` + ``FSDPEngineWithLMHead`` (strategy fsdp2, gloo) once, and trains with verl's own
``ppo_loss``, i.e. the objects ``ActorRolloutRefWorker`` wires together, so every loss is reached through
verl's registry, its config plumbing (``tau_pos``/``tau_neg``/``loss_scale_factor``/``global_batch_info``), its
micro-batch splitter and its metric aggregation. Two jobs, results under OUT (rank 0 writes them):

- ``apo_step`` (one rank only, ``test_loss_fsdp_step.py``): one on-policy APO step on a 4-row batch, in the
  legacy trainer's padded layout;
- ``invariance`` (``test_gradient_invariance.py``): for each loss and each cut of one 8-row mini-batch (fixed
  micro-batch sizes, or dynamic ones from a token budget), in the V1 trainer's layout, the full parameters after
  one SGD step from the same initial weights, and the sizes of the micro-batches verl's splitter made.

Everything here mutates process-wide state (environment, process group, verl's platform singleton): run it only
as a subprocess, through the ``fsdp_steps`` fixture of tests/e2e/conftest.py.
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path

STARTED = time.perf_counter()

# --- apo_step: the 4-row batch of test_loss_fsdp_step.py -------------------------------------------------------
STEP_PROMPT_LENS = [4, 3, 2, 4]
STEP_RESPONSE_LENS = [6, 4, 5, 2]
# L0 = data.max_response_length, larger than this batch's padded width (6, as for most micro-batches in a real
# run): the loss must divide by L0, not by the width verl falls back to when loss_scale_factor is unset.
STEP_L0 = 10
STEP_ADVANTAGES = [1.0, -1.0, 0.5, -0.5]
# Asymmetric so that the closed-form loss depends on which temperature each sign gets.
STEP_TAU_POS, STEP_TAU_NEG = 1.0, 2.0
STEP_MICRO_BATCH_SIZE = 2  # two micro-batches: APO's 1/G must span the mini-batch, not each micro-batch

# --- invariance: one 8-row mini-batch ---------------------------------------------------------------------------
# Sequences of 12, 7, 6, 7 | 13, 4, 10, 7 tokens: with 2 ranks each gets 4 rows (verl dispatches contiguous
# chunks). Response lengths 1..9 so that every micro-batch has its own padded width.
PROMPT_LENS = [3, 5, 2, 4, 6, 3, 4, 2]
RESPONSE_LENS = [9, 2, 4, 3, 7, 1, 6, 5]
ADVANTAGES = [1.0, -0.8, 0.5, -1.2, 0.7, -0.3, 1.5, -0.6]
L0 = 12  # data.max_response_length: above every response length, as in a real run
# Old log-probs = log(1/vocab) + uniform noise in [-OLD_NOISE, OLD_NOISE]: the tiny random model's log-probs are
# close to log(1/vocab), so ratios spread over about exp(+-1), beyond both ends of PPO's clip (0.8, 1.2) and far
# enough into APO's gate for weights below 0.5 (r > 2.2 with tau_- = 1.5). Fixed numbers, not the model's: every
# run and rank sees bit-identical old log-probs.
OLD_NOISE = 1.0
# Token budgets of use_dynamic_bsz (prompt + response tokens, verl's max_token_len_per_gpu). 14 cuts the whole
# mini-batch into 5 micro-batches of 1-2 rows and each rank's 4 rows into 3 of 1-2; 23 cuts the whole one into
# 2-3-3 (each rank's half into 2+2).
TOKEN_BUDGETS = (14, 23)
# SGD: its update is linear in the gradient, so a gradient off by a factor shows in the weights (AdamW's first
# step is about lr * sign(g) and hides any constant factor). This lr moves the weights by a few percent of their
# norm, so the 1e-6 tolerance on weights resolves gradient errors down to a few 1e-5.
LR = 1.0
# Clipping is verl's (optimizer_step always clips): a norm no gradient reaches leaves the gradient untouched.
CLIP_GRAD = 1e9
VOCAB = 128
RESULT_FILE = "result.json"
PARAMS_FILE = "params.pt"
# Losses: the presets as conf/method/*.yaml set them, and two of verl's that each micro-batch normalises its own
# way (negative controls): vanilla + seq-mean-token-sum-norm with no loss_scale_factor (divides by the
# micro-batch's padded width) and geo_mean (a plain mean over the micro-batch's sequences).
PRESETS = ("apo", "drgrpo", "grpo", "codapo")
CONTROLS = {
    "vanilla_norm_no_l0": ("drgrpo", {"loss_scale_factor": None}),
    "geo_mean": ("grpo", {"policy_loss": {"loss_mode": "geo_mean"}}),
}


def build_tiny_model(model_dir: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
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
    model = Qwen2ForCausalLM(config)
    # transformers starts the attention biases at 0: a bias that is still 0 turns a comparison of weights into
    # one of updates. A trained model's biases are not 0.
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            torch.nn.init.normal_(param, std=config.initializer_range)
    model.save_pretrained(model_dir)


def padded_batch(prompt_lens, response_lens, seed: int = 1) -> dict:
    """A rollout batch laid out as verl's trainer holds it: left-padded prompts, right-padded responses."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    bsz, prompt_width, response_width = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompts = torch.zeros(bsz, prompt_width, dtype=torch.long)
    responses = torch.zeros(bsz, response_width, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    response_mask = torch.zeros_like(responses)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        prompts[i, prompt_width - p :] = torch.randint(3, VOCAB, (p,), generator=gen)
        prompt_mask[i, prompt_width - p :] = 1
        responses[i, :r] = torch.randint(3, VOCAB, (r,), generator=gen)
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


def to_engine_input(tensors: dict, **meta):
    """What RayPPOTrainer does before every worker call: DataProto -> TensorDict -> no-padding layout."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    # The trainer puts the rollout temperature in meta_info; the engine divides logits by it.
    td = tu.get_tensordict(tensor_dict={k: v.clone() for k, v in tensors.items()}, non_tensor_dict={"temperature": 1.0})
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, **meta)
    return td


def update_meta(global_batch_size: int) -> dict:
    """What the trainer's _update_actor adds to a batch for ``train_mini_batch``: here one mini-batch, one epoch."""
    return {
        "calculate_entropy": False,
        "global_batch_size": global_batch_size,
        "mini_batch_size": global_batch_size,
        "epochs": 1,
        "seed": 42,
        "dataloader_kwargs": {"shuffle": False},
        "compute_loss": True,
    }


def log_probs(worker, batch: dict):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    # The trainer's _compute_old_log_prob path (compute_log_prob -> TrainingWorker.infer_batch).
    td = to_engine_input(batch, calculate_entropy=False, compute_loss=False)
    output = worker.infer_batch(td)
    return no_padding_2_padding(tu.get(output, "log_probs"), td).float()


def full_params(module) -> dict:
    """Every parameter, whole (a collective with more than one rank: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in module.named_parameters()
    }


def local_shards(module) -> dict:
    from torch.distributed.tensor import DTensor

    return {name: (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in module.named_parameters()}


def restore(module, shards: dict) -> None:
    """Put this rank's saved shards back: the next configuration starts from the same weights (SGD keeps no
    state, the engine zeroes the gradients before each step)."""
    import torch
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for name, p in module.named_parameters():
            (p.to_local() if isinstance(p, DTensor) else p).copy_(shards[name])


def build_worker(model_dir: Path):
    from verl.workers.config import (
        FSDPActorConfig,
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        TrainingWorkerConfig,
    )
    from verl.workers.engine_workers import TrainingWorker

    model_config = HFModelConfig(
        path=str(model_dir),
        load_tokenizer=False,  # the engine only consumes token ids
        # verl defaults to flash_attention_2, which has no CPU kernel. The default remove-padding (packed)
        # layout still works: transformers' sdpa mask splits packed sequences at position_ids resets.
        override_config={"attn_implementation": "sdpa"},
    )
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",  # FSDP1 (strategy="fsdp") syncs module states, which it only does on GPU
        # What ActorRolloutRefWorker.init_model copies into the engine from the actor/rollout config. Each
        # invariance step overrides the training cut in its input; the log-prob pass and the apo_step update use
        # these, the same fixed micro-batches, so both forwards see identical inputs.
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=STEP_MICRO_BATCH_SIZE,
        infer_micro_batch_size_per_gpu=STEP_MICRO_BATCH_SIZE,
        # verl's default (None) computes in bf16, whose 3 significant digits cannot show a 1e-6 invariance.
        mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    )
    actor_config = FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=STEP_MICRO_BATCH_SIZE,
        # No weight decay: any parameter movement then comes from the loss gradient alone.
        optim=FSDPOptimizerConfig(optimizer="SGD", lr=LR, weight_decay=0.0, clip_grad=CLIP_GRAD),
        fsdp_config=engine_config,
    )
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
    return worker


def loss_config(preset: str, **overrides):
    """verl's actor config with the loss settings of ``conf/method/<preset>.yaml`` (L0 resolved), as ppo_loss
    reads them; ``overrides`` replace preset keys."""
    from importlib.resources import files

    from omegaconf import OmegaConf
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    text = (files("recipe_apo.conf") / "method" / f"{preset}.yaml").read_text()
    node = OmegaConf.merge(OmegaConf.create(text), {"data": {"max_response_length": L0}})
    actor = OmegaConf.to_container(node.actor_rollout_ref.actor, resolve=True)
    policy_loss = {**actor.pop("policy_loss"), **overrides.pop("policy_loss", {})}
    actor.update(overrides)
    # ppo_micro_batch_size_per_gpu only satisfies the config's own check: the engine's micro-batches come from
    # each step's input.
    return FSDPActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                           policy_loss=PolicyLossConfig(**policy_loss), **actor)


def apo_step(worker) -> dict:
    """One on-policy APO step (test_loss_fsdp_step.py): loss value, gate metrics, parameter movement."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    from recipe_apo.methods.apo.loss import compute_policy_loss_apo

    bsz = len(STEP_PROMPT_LENS)
    config = FSDPActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_mini_batch_size=bsz,
        ppo_micro_batch_size_per_gpu=STEP_MICRO_BATCH_SIZE,
        loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=STEP_L0,
        tau_pos=STEP_TAU_POS,
        tau_neg=STEP_TAU_NEG,
        policy_loss=PolicyLossConfig(loss_mode="apo"),
    )
    worker.set_loss_fn(partial(ppo_loss, config=config))

    batch = padded_batch(STEP_PROMPT_LENS, STEP_RESPONSE_LENS)
    response_mask = batch["response_mask"]
    advantages = torch.tensor(STEP_ADVANTAGES).unsqueeze(1) * response_mask.float()
    old_log_probs = log_probs(worker, batch)
    # A second forward with the same weights bounds the forward-pass noise the gate sees.
    max_gap = (log_probs(worker, batch) - old_log_probs).abs().max().item()

    before = full_params(worker.engine.module)
    output = worker.train_mini_batch(
        to_engine_input({**batch, "old_log_probs": old_log_probs, "advantages": advantages}, **update_meta(bsz)))
    metrics = tu.get(output, "metrics")
    after = full_params(worker.engine.module)
    deltas = {name: (after[name] - before[name]).abs().max().item() for name in before}
    watched = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]

    def apo_loss(current) -> float:
        loss, _ = compute_policy_loss_apo(
            old_log_prob=old_log_probs,
            log_prob=current,
            advantages=advantages,
            response_mask=response_mask.bool(),
            loss_agg_mode="seq-mean-token-sum-norm",
            config=config,
        )
        return loss.item()

    return {
        "batch": {"advantages": STEP_ADVANTAGES, "response_lens": STEP_RESPONSE_LENS, "l0": STEP_L0,
                  "tau_pos": STEP_TAU_POS, "tau_neg": STEP_TAU_NEG},
        "metrics": metrics,
        "n_params": len(before),
        "param_deltas": {name: deltas[name] for name in watched},
        "changed_fraction": sum(d > 0 for d in deltas.values()) / len(deltas),
        "max_abs_logprob_gap": max_gap,
        "apo_loss_before": apo_loss(old_log_probs),
        "apo_loss_after": apo_loss(log_probs(worker, batch)),
    }


def invariance_rows() -> list[dict]:
    """The 8 rows as verl's V1 trainer stores them in TransferQueue: one unpadded tensor per field and row."""
    import math

    import torch

    gen = torch.Generator().manual_seed(2)
    rows = []
    for p, r, advantage in zip(PROMPT_LENS, RESPONSE_LENS, ADVANTAGES):
        prompt, response = torch.randint(3, VOCAB, (p,), generator=gen), torch.randint(3, VOCAB, (r,), generator=gen)
        rows.append({
            "prompts": prompt,
            "responses": response,
            "input_ids": torch.cat([prompt, response]),
            "position_ids": torch.arange(p + r),
            "response_mask": torch.ones(r, dtype=torch.long),
            "loss_mask": torch.ones(r, dtype=torch.long),
            "old_log_probs": torch.rand(r, generator=gen) * (2 * OLD_NOISE) - OLD_NOISE - math.log(VOCAB),
            "advantages": torch.full((r,), advantage),
        })
    return rows


def v1_train_input(rows: list[dict], global_batch_size: int, **engine_keys):
    """What a training worker receives from TransferQueue in verl's V1 trainer (trainer_base._update_actor, then
    the dispatch's fetch): jagged tensors, no padding anywhere, so ppo_loss pads each micro-batch to its own
    longest response. (The legacy trainer's left_right_2_no_padding, ``to_engine_input``, records the batch's
    padded width instead, ``max_response_len``, and every micro-batch is padded to that.)"""
    import torch
    from verl.utils import tensordict_utils as tu

    tensors = {key: torch.nested.as_nested_tensor([row[key] for row in rows], layout=torch.jagged)
               for key in rows[0]}
    return tu.get_tensordict(tensor_dict=tensors, non_tensor_dict={
        "temperature": 1.0, **update_meta(global_batch_size), **engine_keys})


def cuts(rows_per_rank: int) -> list[tuple[str, dict]]:
    """Every way this run cuts its rank's share of the mini-batch: name -> the engine keys of the step."""
    fixed = [(f"micro{m}", {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": m})
             for m in sorted({1, 2, rows_per_rank})]
    dynamic = [(f"tokens{b}", {"use_dynamic_bsz": True, "max_token_len_per_gpu": b}) for b in TOKEN_BUDGETS]
    return fixed + dynamic


def invariance(worker, rank: int, world_size: int) -> tuple[dict, dict]:
    """One SGD step per (loss, cut) from the same initial weights; returns (report, full params per step)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.utils.losses import ppo_loss

    # verl's own splitter, watched where the engine calls it: the micro-batch sizes each step really used.
    splits = []
    splitter = transformer_impl.prepare_micro_batches

    def recording_splitter(*args, **kwargs):
        micro_batches, indices = splitter(*args, **kwargs)
        splits.append([len(mb) for mb in micro_batches])
        return micro_batches, indices

    transformer_impl.prepare_micro_batches = recording_splitter

    n = len(PROMPT_LENS)
    per_rank = n // world_size
    # verl dispatches contiguous chunks of the step's rows to the ranks (KVBatchMeta.chunk).
    mine = invariance_rows()[rank * per_rank : (rank + 1) * per_rank]
    module = worker.engine.module
    initial = local_shards(module)
    params = {"initial": full_params(module)}
    report = {"steps": {}, "rows_per_rank": per_rank}
    configs = {name: loss_config(name) for name in PRESETS}
    configs.update({name: loss_config(preset, **dict(overrides)) for name, (preset, overrides) in CONTROLS.items()})
    for loss_name, config in configs.items():
        worker.set_loss_fn(partial(ppo_loss, config=config))
        for cut_name, engine_keys in cuts(per_rank):
            restore(module, initial)
            splits.clear()
            output = worker.train_mini_batch(v1_train_input(mine, n, **engine_keys))
            key = f"{loss_name}/{cut_name}"
            params[key] = full_params(module)
            # Each rank's own split: rank 0 gathers them (all_gather_object is a collective: every rank calls it).
            report["steps"][key] = {"metrics": tu.get(output, "metrics"), "splits": gather(splits)}
    transformer_impl.prepare_micro_batches = splitter
    return report, params


def gather(value):
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _jsonable(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def main(out: Path, rank: int, world_size: int, port: int) -> None:
    import fsdp_cpu_shims

    # Before anything imports verl.workers.engine, which resolves the device at import time.
    fsdp_cpu_shims.install(rank, world_size, port)

    import torch

    model_dir = out / f"tiny-qwen2-rank{rank}"  # the same seeded weights on every rank (checked by the tests)
    build_tiny_model(model_dir)
    worker = build_worker(model_dir)

    result = {"world_size": world_size, "lr": LR, "seconds": {}}

    def lap(name: str) -> None:
        result["seconds"][name] = {"wall": time.perf_counter() - STARTED, "cpu": time.process_time()}

    lap("worker_built")
    if world_size == 1:
        # From the freshly built weights, which every job starts from.
        fresh = local_shards(worker.engine.module)
        result["apo_step"] = apo_step(worker)
        restore(worker.engine.module, fresh)
        lap("apo_step")
    report, params = invariance(worker, rank, world_size)
    lap("invariance")
    result["invariance"] = report
    if rank == 0:
        torch.save(params, out / PARAMS_FILE)
        (out / RESULT_FILE).write_text(json.dumps(result, default=_jsonable))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
