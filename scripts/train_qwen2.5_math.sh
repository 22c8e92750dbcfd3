#!/usr/bin/env bash
# The paper's runs (section 5.1): Qwen2.5-Math-1.5B or -7B on MATH levels 3-5, one node of 8 GPUs (80 GB each
# assumed for 7B). The two sizes share every setting but the model and how vLLM fits it on a GPU.
#
#   scripts/train_qwen2.5_math.sh 1.5b method=apo                      # or 7b; or grpo, drgrpo
#   METHOD=drgrpo scripts/train_qwen2.5_math.sh 7b trainer.logger=[console,wandb]
#
# scripts/train_qwen2.5_math_1.5b.sh and train_qwen2.5_math_7b.sh are this script with the size filled in.
# The paper says MATH levels 3-5 is the training set "for models under 7B" and names no other one; Dr. GRPO
# trained its 7B model on the same 8,523 problems (examples/qwen2.5-math-7b.sh), and so does the 7B run here.
#
# Every further argument is a Hydra override of `python -m recipe_apo.main` and wins over the values below.
# Data: `python scripts/prepare_data.py --out-dir "$DATA_DIR"` first.
# Environment: DATA_DIR (~/data/recipe_apo), MODEL (Qwen/Qwen2.5-Math-1.5B or -7B), NGPUS (8), NNODES (1),
# PYTHON (python), LOGGERS (console,file: verl's trainer.logger, e.g. console,wandb), EXPERIMENT_NAME (default:
# qwen2.5-math-<size>-<method>[-<your overrides>]-<hash of every setting that counts>, made by recipe_apo/integration/naming.py),
# VAL_N (4 samples per problem at validation, or greedy), VAL_TEMPERATURE (1.0), VAL_TOP_P (1.0).
# Seed: data.seed=N (42) reseeds the prompt order, vLLM's sampling and the mini-batch shuffle, and names the run;
# three seeds of a method in one Hydra multirun: -m method=apo data.seed=1,2,3 (docs/paper.md).
# Checkpoints: every saved one is kept (every 64 rounds); trainer.max_actor_ckpt_to_keep=N keeps the last N.
# RECIPE_APO_DRY_RUN=1 names and validates the run and prints where it writes, starting nothing (=cfg prints
# the composed config with Hydra's --cfg job; =args prints the command).
# Every run records its rollouts and validation generations under its checkpoint folder (see docs/paper.md).
#
# Settings marked [paper] are section 5.1's; [Dr. GRPO] are from Dr. GRPO's own script for the size
# (sail-sg/understand-r1-zero, examples/qwen2.5-math-1.5b.sh and -7b.sh), whose setup the paper says it follows;
# the rest are verl plumbing that does not change the algorithm.
set -euo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib/recipe_launch.sh"

# [paper] the base models, not their instruct versions
size="${1:-}"
case "$size" in
    1.5b) default_model=Qwen/Qwen2.5-Math-1.5B rollout_tp=1 rollout_memory=0.6 ;;
    # tensor parallel 2: 4 vLLM replicas, room for the KV cache beside FSDP
    7b) default_model=Qwen/Qwen2.5-Math-7B rollout_tp=2 rollout_memory=0.5 ;;
    *) echo "error: the first argument must be the model size, 1.5b or 7b, got '$size'" >&2; exit 2 ;;
esac
shift

recipe_parse_method "$@"
recipe_validation 4

DATA_DIR="${DATA_DIR:-$HOME/data/recipe_apo}"
MODEL="${MODEL:-$default_model}"
NGPUS="${NGPUS:-8}"
NNODES="${NNODES:-1}"

args=(
    # --- data ---------------------------------------------------------------------------------------------------
    data.train_files="$DATA_DIR/math_lvl3to5.parquet"  # [paper] MATH levels 3-5, 8,523 problems
    # [paper] AIME24 (30), AMC (83), MATH500 (500), Minerva (272), OlympiadBench (675); verl reports each as
    # val-core/<benchmark>/acc/mean@<VAL_N> (mean pass@1; its SE: scripts/evaluate.py --validation).
    "data.val_files=[$DATA_DIR/aime24.parquet,$DATA_DIR/amc.parquet,$DATA_DIR/math500.parquet,$DATA_DIR/minerva.parquet,$DATA_DIR/olympiadbench.parquet]"
    data.train_batch_size=128        # [paper] 1,024 rollouts per round = 128 prompts x 8 rollouts
    data.max_prompt_length=1024      # [Dr. GRPO] prompt_max_length 1024 (+3,000 fits the model's 4,096 positions)
    data.max_response_length=3000    # [paper] responses capped at 3,000 tokens; also L0 (loss_scale_factor)
    data.filter_overlong_prompts=true
    data.shuffle=true
    # verl's default (null) draws a new prompt order every run: seeded, each method sees the same prompts in
    # the same order, so a difference between methods is not a difference in data order. The run's seed: the
    # rollout's sampling and the mini-batch shuffle follow it (below), so data.seed=N is another run of it.
    data.seed=42

    # --- rollout ------------------------------------------------------------------------------------------------
    actor_rollout_ref.model.path="$MODEL"  # [paper] the base model of the size (above)
    actor_rollout_ref.rollout.n=8          # [paper] 8 rollouts per question
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.temperature=1.0  # [Dr. GRPO] temperature 1, top_p 1
    actor_rollout_ref.rollout.top_p=1.0
    actor_rollout_ref.rollout.tensor_model_parallel_size="$rollout_tp"
    actor_rollout_ref.rollout.gpu_memory_utilization="$rollout_memory"
    'actor_rollout_ref.rollout.seed=${data.seed}'  # vLLM's sampling seed (verl's default: 42 in every run)
    # Validation samples VAL_N (4) answers per problem at temperature 1, top-p 1, same 3,000-token cap. The paper
    # does not say how it evaluated; its figures are not multiples of 1/problems, so not one answer per problem
    # (docs/paper.md, "Evaluation protocol"). With 4 samples the MATH500, Minerva and OlympiadBench figures are
    # attainable, at 4x greedy's cost every 16 rounds. The table's figures come from
    # scripts/evaluate.py (32 samples per AIME24 problem, 16 per AMC one). VAL_N=greedy: Dr. GRPO's greedy
    # evaluation (eval_temperature 0, one sample).
    "${VALIDATION[@]}"

    # --- policy update ------------------------------------------------------------------------------------------
    # [paper] "updated 8 times with a batch size of 128": verl counts ppo_mini_batch_size in PROMPTS and
    # multiplies it by rollout.n, so 16 prompts = 128 rollouts per update, and 1,024 / 128 = 8 updates per
    # round with ppo_epochs=1.
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.actor.ppo_epochs=1
    # Shuffled before they are cut into mini-batches: verl stores a step's responses in the order they finish
    # (short ones first) and cuts mini-batches in sequence, so unshuffled the 8th, most off-policy update would
    # always get the longest and truncated responses: a length effect in a study of length bias. [Dr. GRPO]
    # Oat shuffles every epoch.
    actor_rollout_ref.actor.shuffle=true
    'actor_rollout_ref.actor.data_loader_seed=${data.seed}'  # that shuffle's seed (verl's default: 42)
    actor_rollout_ref.actor.optim.lr=1e-6                     # [Dr. GRPO] learning_rate 1e-6
    actor_rollout_ref.actor.optim.lr_scheduler_type=constant  # [Dr. GRPO] lr_scheduler constant
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0
    actor_rollout_ref.actor.optim.weight_decay=0.0            # [Dr. GRPO] Oat's defaults: l2 0,
    "actor_rollout_ref.actor.optim.betas=[0.9,0.95]"           #   Adam betas (0.9, 0.95),
    actor_rollout_ref.actor.optim.clip_grad=1.0               #   max_norm 1.0
    actor_rollout_ref.actor.entropy_coeff=0.0
    # beta 0 [Dr. GRPO]: no KL term anywhere; the method presets set use_kl_loss / use_kl_in_reward false.
    # Micro-batches by token count: only memory changes, the loss is aggregated over the whole mini-batch.
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.model.use_remove_padding=true

    # --- reward -------------------------------------------------------------------------------------------------
    # 1 when the last \boxed{} answer equals the ground truth (math-verify), else 0: recipe_apo/reward/scorer.py.
    reward.custom_reward_function.path=pkg://recipe_apo.reward
    reward.custom_reward_function.name=compute_score
    # [Dr. GRPO] a response the 3,000-token cap cut off scores 0 (recipe_apo/reward/truncation.py)
    truncation=zero

    # --- schedule -----------------------------------------------------------------------------------------------
    trainer.n_gpus_per_node="$NGPUS"
    trainer.nnodes="$NNODES"
    # The paper does not state the run length; Dr. GRPO's script caps it at num_prompt_epoch 20
    # (8,523 // 128 = 66 rounds per epoch, 1,320 in all). Stop earlier with trainer.total_training_steps=N.
    trainer.total_epochs=20
    trainer.test_freq=16             # [Dr. GRPO] eval_steps 16
    trainer.val_before_train=true    # the base model's row of the table
    trainer.save_freq=64
    # Every saved checkpoint is kept (21 over the 1,320 rounds), so any stage of training can be evaluated
    # later: about 18 GB each for 1.5B, 90 GB for 7B (docs/paper.md). trainer.max_actor_ckpt_to_keep=N keeps
    # the last N.
    trainer.max_actor_ckpt_to_keep=null
)

recipe_launch "qwen2.5-math-$size" "${args[@]}"
