"""The CPU testbed: GRPO, Dr. GRPO and APO trained side by side on a small verifiable task, through verl's own
compute_advantage and registered policy losses (``python -m recipe_apo.testbed``; see conf/testbed.yaml)."""
