#!/usr/bin/env bash
# A small single-GPU run: Qwen2.5-0.5B-Instruct on GSM8K, the paper's recipe scaled down, to compare the three
# methods in hours instead of days. Not a result of the paper.
#
#   scripts/train_qwen2.5_0.5b_gsm8k.sh method=apo                     # or grpo, drgrpo
#   METHOD=grpo scripts/train_qwen2.5_0.5b_gsm8k.sh trainer.total_epochs=1
#
# Every further argument is a Hydra override of `python -m recipe_apo.main` and wins over the values below.
# Data: `python scripts/prepare_data.py --splits gsm8k --out-dir "$DATA_DIR"` first (the Qwen-Math prompt,
# boxed answers). verl's own GSM8K parquet files work too (data.train_files=... data.val_files=...): the
# reward scores their `openai/gsm8k` rows with verl's "#### answer" rule.
# Environment: DATA_DIR (~/data/recipe_apo), MODEL (Qwen/Qwen2.5-0.5B-Instruct),
# PYTHON (python), LOGGERS (console,file: verl's trainer.logger, e.g. console,wandb), EXPERIMENT_NAME (default:
# qwen2.5-0.5b-gsm8k-<method>[-<your overrides>]-<hash of every setting that counts>, made by recipe_apo/integration/naming.py),
# VAL_N (greedy here; or a number of samples per problem), VAL_TEMPERATURE (1.0), VAL_TOP_P (1.0).
# Seed: data.seed=N (42) reseeds the prompt order, vLLM's sampling and the mini-batch shuffle, and names the run.
# RECIPE_APO_DRY_RUN=1 names and validates the run and prints where it writes, starting nothing (=cfg prints
# the composed config with Hydra's --cfg job; =args prints the command).
# Every run records its rollouts and validation generations under its checkpoint folder (see docs/paper.md).
#
# [paper] marks settings kept from section 5.1 (the group size, the update structure, L0 = the response cap);
# the sizes are scaled to one GPU and GSM8K's short solutions.
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib/recipe_launch.sh"

recipe_parse_method "$@"
recipe_validation greedy

DATA_DIR="${DATA_DIR:-$HOME/data/recipe_apo}"
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"

args=(
    # --- data ---------------------------------------------------------------------------------------------------
    data.train_files="$DATA_DIR/gsm8k_train.parquet"  # 7,473 problems
    data.val_files="$DATA_DIR/gsm8k_test.parquet"     # 1,319 problems, greedy pass@1 (VAL_N)
    data.train_batch_size=64         # 64 prompts x 8 = 512 rollouts per round (the paper: 128 x 8)
    data.max_prompt_length=512
    data.max_response_length=1024    # GSM8K solutions are short; also L0 (loss_scale_factor)
    data.filter_overlong_prompts=true
    data.shuffle=true
    # verl's default (null) draws a new prompt order every run: seeded, each method sees the same prompts in
    # the same order, so a difference between methods is not a difference in data order. The run's seed: the
    # rollout's sampling and the mini-batch shuffle follow it (below), so data.seed=N is another run of it.
    data.seed=42

    # --- rollout ------------------------------------------------------------------------------------------------
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.rollout.n=8              # [paper] 8 rollouts per question
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.top_p=1.0
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4
    'actor_rollout_ref.rollout.seed=${data.seed}'  # vLLM's sampling seed
    # Greedy validation by default: cheap, and this run is not the paper's table (VAL_N=4 samples instead).
    "${VALIDATION[@]}"

    # --- policy update ------------------------------------------------------------------------------------------
    # [paper] 8 updates per round: verl counts ppo_mini_batch_size in prompts (x rollout.n), so 8 prompts =
    # 64 rollouts per update and 512 / 64 = 8 updates per round.
    actor_rollout_ref.actor.ppo_mini_batch_size=8
    actor_rollout_ref.actor.ppo_epochs=1
    actor_rollout_ref.actor.shuffle=true  # mini-batches of mixed lengths (see train_qwen2.5_math.sh)
    'actor_rollout_ref.actor.data_loader_seed=${data.seed}'  # that shuffle's seed
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.optim.lr_scheduler_type=constant
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0
    actor_rollout_ref.actor.optim.weight_decay=0.0
    "actor_rollout_ref.actor.optim.betas=[0.9,0.95]"
    actor_rollout_ref.actor.optim.clip_grad=1.0
    actor_rollout_ref.actor.entropy_coeff=0.0
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.model.use_remove_padding=true

    # --- reward -------------------------------------------------------------------------------------------------
    reward.custom_reward_function.path=pkg://recipe_apo.reward
    reward.custom_reward_function.name=compute_score
    truncation=zero  # a response the length cap cut off scores 0, as in Dr. GRPO

    # --- schedule -----------------------------------------------------------------------------------------------
    trainer.n_gpus_per_node=1
    trainer.nnodes=1
    trainer.total_epochs=2           # 7,473 // 64 = 116 rounds per epoch
    trainer.test_freq=20
    trainer.val_before_train=true
    trainer.save_freq=116
    trainer.max_actor_ckpt_to_keep=null  # both saved checkpoints kept (about 6 GB each); =N keeps the last N
)

recipe_launch qwen2.5-0.5b-gsm8k "${args[@]}"
