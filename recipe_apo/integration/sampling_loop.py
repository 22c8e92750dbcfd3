"""Per-prompt sampling settings through verl's agent loops: the ``recipe_sampling`` agent loop.

verl's agent loop worker samples every prompt of a batch with the rollout's one set of sampling parameters, and
hands each prompt's batch columns to its agent loop as keyword arguments. A method whose runtime sets sampling
settings per prompt (``Method.prompt_columns``: AGPO's temperature) gets them into the batch as columns
``recipe_sampling_<name>`` (``recipe_apo.integration.verl_access.route_sampling``), and every prompt runs
``recipe_sampling``: a loop that wraps another. It reads the prompt's columns, runs the loop named in
``recipe_agent_name`` (the prompt's own ``agent_name``, or the rollout's ``default_agent_loop`` when it had none)
with those parameters replaced, and returns that loop's output unchanged. So the setting reaches every generate
call of any agent loop (single-turn, the rehearsal's two-turn loops, tool loops), on vLLM and on the rehearsal's
``hf`` server alike, as a per-request sampling parameter. top_p and top_k are the training rollout's
(``rollout.top_p/top_k``) also when verl runs the prompt on its validation path (where AGPO's probe runs).

verl registers agent loops from ``rollout.agent.agent_loop_config_path``: this folder's ``agent_loops.yaml`` names
this loop, and the launch points the setting at it when a method needs it (``recipe_apo.integration.validation``).
Its names are ``recipe_apo.integration.sampling``'s, which imports no verl (the launch reads them).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from recipe_apo.integration.sampling import COLUMN_PREFIX, INNER_KEY, NAME
from recipe_apo.integration.verl_worker_access import agent_loop, registered_agent_loops


class SamplingAgentLoop(AgentLoopBase):
    """Runs the prompt's own agent loop with the prompt's sampling settings."""

    def __init__(self, **init: Any) -> None:
        super().__init__(**init)
        self._init = init

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        inner = kwargs.pop(INNER_KEY, None) or self.rollout_config.agent.default_agent_loop
        own = {key[len(COLUMN_PREFIX):]: kwargs.pop(key) for key in list(kwargs) if key.startswith(COLUMN_PREFIX)}
        if inner == NAME or inner not in registered_agent_loops():
            raise ValueError(f"{NAME}: the prompt's agent loop {inner!r} is not a registered agent loop")
        params = dict(sampling_params, top_p=self.rollout_config.top_p, top_k=self.rollout_config.top_k)
        params.update({key: float(value) for key, value in own.items() if value is not None})
        loop = agent_loop(inner, self._init)
        return await loop.run(params, **kwargs)
