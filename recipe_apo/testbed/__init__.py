"""The CPU testbed: GRPO, Dr. GRPO and APO trained side by side on a small verifiable task (work in progress)."""
