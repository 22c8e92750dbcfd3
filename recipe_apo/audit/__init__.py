"""The bias audit: ``python -m recipe_apo.audit RUN_DIR [RUN_DIR ...]`` on verl's rollout dumps.

``dumps`` reads them, ``stats`` holds the statistics (shared with the CPU testbed), ``analysis`` applies the
three methods to one run's rollouts, ``report`` writes the markdown and the figure.
"""
