"""The names of the ``recipe_sampling`` agent loop (``recipe_apo.integration.sampling_loop``), apart from the loop,
which imports verl's agent loop: the launch and the CPU rehearsal read these before verl loads."""

from pathlib import Path

NAME = "recipe_sampling"
TARGET = "recipe_apo.integration.sampling_loop.SamplingAgentLoop"
# The recipe's agent loop file (verl's rollout.agent.agent_loop_config_path), which registers the loop.
AGENT_LOOPS = str(Path(__file__).with_name("agent_loops.yaml"))
# The batch columns: the prompt's own agent loop, and each sampling setting (``COLUMN_PREFIX + name``).
INNER_KEY = "recipe_agent_name"
COLUMN_PREFIX = "recipe_sampling_"
