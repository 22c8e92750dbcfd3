"""A two-turn agent loop for the CPU rehearsal: multi-turn and multi-output trajectories on the tiny model.

verl 0.9.1's own agent loops return one output each (``single_turn_agent``; ``tool_agent``, which would stay
single-turn on the tiny model: a random-weight or warmed-up toy model never writes a parsable
``<tool_call>``). This loop runs the same two turns for every trajectory, through the rehearsal's ``hf`` server
exactly as verl's loops call vLLM (``server_manager.generate``, verl's Continuous Token builder for the chat
turns): generate; append a fixed user turn (the prompt's question, asked again); generate again. It returns

- ``outputs=one`` (``recipe_two_turn``): one output, the whole conversation after the prompt as the response,
  ``response_mask`` 1 on both assistant turns and 0 on the user turn (as ``tool_agent`` writes it);
- ``outputs=per_turn`` (``recipe_two_turn_per_turn``): two outputs, one per turn; the second's prompt holds the
  first turn and the user turn, its response is the second turn (a multi-output trajectory: verl writes rows
  ``{uid}_{session}_0`` and ``{uid}_{session}_1``, scores the last and copies its reward to the first);
- ``outputs=alternate`` (``recipe_two_turn_alternate``): odd sessions as ``per_turn``, even ones as ``one``, so
  trajectories of one prompt have different numbers of outputs (the batch where the final-output rule matters).

Select it with ``actor_rollout_ref.rollout.agent.agent_loop_config_path=<CONFIG_PATH>`` (this folder's
``agent_loops.yaml``, which names the three) and ``actor_rollout_ref.rollout.agent.default_agent_loop=<name>``;
``data.max_response_length`` must leave room for two turns and the user turn (``MIN_RESPONSE_LENGTH`` tells the
loop's own floor; 48 suits the tiny task). ``last_turn_score`` is the toy task's reward on the last assistant
turn (a one-output conversation decodes with the user turn in it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer

from recipe_apo.cpu import reward as task_reward
from recipe_apo.errors import RecipeError

CONFIG_PATH = str(Path(__file__).with_name("agent_loops.yaml"))
OUTPUT_MODES = ("one", "per_turn", "alternate")
# The smallest response budget the loop accepts: a token for each turn and the user turn in between.
MIN_RESPONSE_LENGTH = 3
ASSISTANT_HEADER = "assistant\n"


class AgentLoopSettingError(RecipeError, ValueError):
    """The two-turn loop cannot run with these settings; the message names the setting."""


class TwoTurnAgentLoop(AgentLoopBase):
    """Two assistant turns around a fixed user turn; ``outputs`` says how the trajectory is returned."""

    def __init__(self, *args, outputs: str = "one", **kwargs):
        super().__init__(*args, **kwargs)
        if outputs not in OUTPUT_MODES:
            raise AgentLoopSettingError(
                f"the two-turn agent loop's outputs={outputs!r} is not one of {', '.join(OUTPUT_MODES)}"
            )
        self.outputs = outputs
        self.response_length = int(self.rollout_config.response_length)
        if self.response_length < MIN_RESPONSE_LENGTH:
            raise AgentLoopSettingError(
                f"data.max_response_length={self.response_length} leaves no room for two turns; the two-turn agent "
                f"loop needs at least {MIN_RESPONSE_LENGTH} (48 suits the tiny task)"
            )

    def split(self, session_id: int) -> bool:
        """Whether this trajectory is returned as one output per turn."""
        return self.outputs == "per_turn" or (self.outputs == "alternate" and session_id % 2 == 1)

    async def _generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                        max_tokens: int, metrics: dict):
        with simple_timer("generate_sequences", metrics):
            return await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt_ids,
                sampling_params={**sampling_params, "max_tokens": max_tokens},
            )

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput | list[AgentLoopOutput]:
        messages = list(kwargs["raw_prompt"])
        request_id = uuid4().hex  # one per trajectory: both turns go to the same server
        prompt_ids = await self.ct_build_initial_tokens(messages)
        logprobs = bool(sampling_params.get("logprobs"))
        metrics: dict[str, Any] = {}

        # Turn 1, at most a third of the budget: the user turn and turn 2 take the rest.
        first = await self._generate(request_id, prompt_ids, sampling_params, max(1, self.response_length // 3),
                                     metrics)
        merged, mask, log_probs = await self.ct_merge_assistant_token(
            prompt_ids, first.token_ids, [], [] if logprobs else None,
            assistant_logprobs=first.log_probs if logprobs else None)
        # The fixed user turn: the prompt's question again.
        messages.append({"role": "assistant", "content": self.tokenizer.decode(first.token_ids,
                                                                               skip_special_tokens=True)})
        previous = list(messages)
        messages.append({"role": "user", "content": str(kwargs["raw_prompt"][-1]["content"])})
        merged, mask, log_probs = await self.ct_merge_context_msg(previous, messages, merged.token_ids, mask,
                                                                  log_probs)
        second_prompt = merged.token_ids
        budget = self.response_length - len(mask)
        if budget < 1:
            raise AgentLoopSettingError(
                f"data.max_response_length={self.response_length}: turn 1 and the user turn took {len(mask)} tokens, "
                "none is left for turn 2; raise data.max_response_length"
            )
        second = await self._generate(request_id, second_prompt, sampling_params, budget, metrics)
        metrics.setdefault("num_preempted", -1)
        extra = {**second.extra_fields, "turn_scores": [], "tool_rewards": []}

        if not self.split(int(kwargs.get("session_id", 0))):
            merged, mask, log_probs = await self.ct_merge_assistant_token(
                second_prompt, second.token_ids, mask, log_probs,
                assistant_logprobs=second.log_probs if logprobs else None)
            return AgentLoopOutput(
                prompt_ids=prompt_ids, response_ids=merged.token_ids[len(prompt_ids):], response_mask=mask,
                response_logprobs=log_probs, num_turns=4, metrics=metrics, extra_fields=extra,
            )
        return [
            AgentLoopOutput(prompt_ids=prompt_ids, response_ids=list(first.token_ids),
                            response_mask=[1] * len(first.token_ids),
                            response_logprobs=list(first.log_probs) if logprobs else None, num_turns=2,
                            metrics=dict(metrics), extra_fields={**first.extra_fields, "turn_scores": [],
                                                                 "tool_rewards": []}),
            AgentLoopOutput(prompt_ids=second_prompt, response_ids=list(second.token_ids),
                            response_mask=[1] * len(second.token_ids),
                            response_logprobs=list(second.log_probs) if logprobs else None, num_turns=4,
                            metrics=metrics, extra_fields=extra),
        ]


def last_turn_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                    **kwargs: Any) -> float:
    """The toy task's exact match (``recipe_apo.cpu.reward``) on the text after the last assistant header: a
    one-output two-turn conversation decodes as ``turn 1, user turn, assistant header, turn 2``."""
    return task_reward.compute_score(data_source, solution_str.rsplit(ASSISTANT_HEADER, 1)[-1], ground_truth,
                                     extra_info, **kwargs)
