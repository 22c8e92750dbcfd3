"""The bias audit: ``python -m recipe_apo.audit RUN_DIR [RUN_DIR ...]`` on verl's rollout dumps.

``dumps`` reads them, ``analysis`` replays the methods on one run's rollouts and measures the biases (with the
statistics of ``recipe_apo.methods.group_stats`` and the replays of ``recipe_apo.integration.replay``, shared
with the CPU testbed), ``report`` writes the markdown and the figure.
"""
