"""A testbed run of seconds, shared by the testbed's and the league's tests (not a test module)."""

# Every size cut down; the seeds are left to each test.
TINY_RUN = [
    "workers=1",
    "rounds=4",
    "eval_every=2",
    "pretrain.steps=30",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "eval.prompts_per_length=2",
    "eval.samples=2",
    "eval.bucket_samples=4",
]
