"""Per-prompt sampling temperature through verl's agent loops: the ``agpo_tempered`` agent loop.

verl's agent loop worker samples every prompt of a batch with the rollout's one temperature, and hands each
prompt's batch columns to its agent loop as keyword arguments. ``agpo_tempered`` is a loop that wraps another:
it reads the prompt's ``agpo_temperature`` column, runs the loop named in ``agpo_agent_name`` (the prompt's own
``agent_name``, or the rollout's ``default_agent_loop`` when it had none) with the temperature replaced, and
returns that loop's output unchanged. So the temperature reaches every generate call of any agent loop
(single-turn, the rehearsal's two-turn loops, tool loops), on vLLM and on the rehearsal's ``hf`` server alike,
as a per-request sampling parameter. top_p and top_k are the training rollout's (``rollout.top_p/top_k``) also
when verl runs the prompt on its validation path, where AGPO's probe runs (``hooks/agpo.py``).

verl registers agent loops from ``rollout.agent.agent_loop_config_path``: ``agpo_launch.AGENT_LOOPS`` (this folder's
``agent_loops.yaml``) names this loop, and the launch points the setting at it for ``method=agpo_dual``
(``recipe_apo.integration.agpo_launch``, which also holds this loop's names).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from recipe_apo.integration.agpo_launch import INNER_KEY, TEMPERATURE_KEY
from recipe_apo.integration.agpo_launch import TEMPERED_LOOP as NAME


class TemperedAgentLoop(AgentLoopBase):
    """Runs the prompt's own agent loop at the prompt's ``agpo_temperature``."""

    def __init__(self, **init: Any) -> None:
        super().__init__(**init)
        self._init = init

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        import hydra
        from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

        inner = kwargs.pop(INNER_KEY, None) or self.rollout_config.agent.default_agent_loop
        temperature = kwargs.pop(TEMPERATURE_KEY, None)
        if inner == NAME or inner not in _agent_loop_registry:
            raise ValueError(f"agpo_tempered: the prompt's agent loop {inner!r} is not a registered agent loop")
        params = dict(sampling_params, top_p=self.rollout_config.top_p, top_k=self.rollout_config.top_k)
        if temperature is not None:
            params["temperature"] = float(temperature)
        loop = hydra.utils.instantiate(config=_agent_loop_registry[inner], **self._init)
        return await loop.run(params, **kwargs)
