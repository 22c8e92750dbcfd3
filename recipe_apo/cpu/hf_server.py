"""The rehearsal's generation server: a Hugging Face causal LM behind verl's token-in, token-out interface.

One Ray actor per rollout replica, in place of verl's vLLM server. verl's agent loop calls ``generate`` once per
response, all of a step's requests at once; the server gathers the requests that arrive together and runs
them as one left-padded batch of ``model.generate`` per set of sampling settings.

At most ``rollout.max_num_seqs`` requests go into one batch, as vLLM schedules them; the rest wait for the next.

Sampling follows what verl passes, as vLLM would: ``temperature`` (0 = greedy), ``top_p``, ``top_k`` (-1 or 0 =
off), ``repetition_penalty``, ``ignore_eos``, ``max_tokens`` (default: ``rollout.response_length``, capped by the
prompt budget as in verl's vLLM server). ``logprobs`` returns, per generated token, its log-probability under
``softmax(logits / temperature)`` before top-k/top-p truncation (raw logits when greedy): what verl's actor
computes for the same token, so ``rollout_log_probs`` and the actor's old log-probs are comparable.

With verl's ``actor_rollout_ref.rollout.full_determinism=true`` each request is generated on its own, its
sampling seeded from the rollout seed, the weights' step, its prompt and how many identical prompts came before it
in that step: the samples no longer depend on which requests were batched together, nor (verl then routes every
request of its single-turn loop to one replica) on how many replicas there are. Slower: no batching.

Partial rollouts, as verl's asynchronous trainers drive vLLM: ``abort_all_requests`` closes the server's gate
(requests that arrive wait for ``resume_generation``, or are turned back with ``reject_request=True``), stops
the generation under way at its next token and answers every request of it that had not ended with the tokens
so far and ``stop_reason="aborted"``; verl's client then sends the prompt and those tokens again after the
resume. Each answer's ``extra_fields["global_steps"]`` is the weights' version it was generated with. A tiny
model ends a batch in milliseconds, so an abort rarely lands inside one: ``RECIPE_APO_HF_SECONDS_PER_TOKEN``
(an environment variable of the server's process) slows generation down to a given pace, for rehearsals of
partial rollouts.

Standalone (verl's ``main_generation_server``), the server also answers OpenAI chat completions over HTTP
(``serve_http``, ``chat_completion``; the HTTP side is ``chat_http``), through the same batching queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from recipe_apo.cpu import chat_http
from recipe_apo.integration.validation import RecipeConfigError

# Keys of verl's sampling_params this server honours; anything else is refused, not ignored.
SAMPLING_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "ignore_eos", "max_tokens", "max_new_tokens"}
)


class RehearsalUnsupported(RecipeConfigError):
    """The CPU rehearsal cannot do what was asked; the message is one line naming the setting."""


@dataclass(frozen=True)
class Sampling:
    """One request's sampling settings, normalised; requests with equal settings share a batch."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    ignore_eos: bool
    max_tokens: int
    logprobs: bool

    @classmethod
    def from_verl(cls, params: dict[str, Any], prompt_len: int, response_length: int, prompt_length: int,
                  max_model_len: Optional[int]) -> "Sampling":
        unknown = sorted(set(params) - SAMPLING_KEYS)
        if unknown:
            raise RehearsalUnsupported(
                f"the CPU rehearsal's hf rollout does not support sampling parameter(s) {', '.join(unknown)}"
            )
        budget = (max_model_len or prompt_length + response_length) - prompt_len
        if budget < 1:
            raise RehearsalUnsupported(
                f"a prompt of {prompt_len} tokens leaves no room to generate within "
                f"{max_model_len or prompt_length + response_length} tokens (data.max_prompt_length / "
                "actor_rollout_ref.rollout.max_model_len)"
            )
        requested = params.get("max_tokens", params.get("max_new_tokens"))
        if requested is None:
            requested = min(response_length, prompt_length + response_length - prompt_len)
        top_k = int(params.get("top_k", -1) or -1)
        return cls(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=-1 if top_k <= 0 else top_k,
            repetition_penalty=float(params.get("repetition_penalty", 1.0)),
            ignore_eos=bool(params.get("ignore_eos", False)),
            max_tokens=max(1, min(int(requested), budget)),
            logprobs=bool(params.get("logprobs", False)),
        )


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    done: asyncio.Future = field(repr=False)


PACE_VARIABLE = "RECIPE_APO_HF_SECONDS_PER_TOKEN"


class Interrupt:
    """Stops a ``model.generate`` at its next token once ``stop`` is set (a ``StoppingCriteria`` of every row),
    and paces it at ``seconds_per_token``."""

    def __init__(self, seconds_per_token: float = 0.0) -> None:
        self.stop = threading.Event()
        self.seconds_per_token = seconds_per_token

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        if self.seconds_per_token > 0:
            time.sleep(self.seconds_per_token)
        return torch.full((input_ids.shape[0],), self.stop.is_set(), dtype=torch.bool, device=input_ids.device)


def ended(token_ids: list[int], sampling: Sampling, eos_ids: list[int]) -> bool:
    """Whether a response ended by itself (an end token, or its token budget), not by an abort."""
    return len(token_ids) >= sampling.max_tokens or (bool(token_ids) and not sampling.ignore_eos
                                                     and token_ids[-1] in eos_ids)


def generate_batch(model, prompts: list[list[int]], sampling: Sampling, eos_ids: list[int], pad_id: int,
                   interrupt: Optional[Interrupt] = None) -> list[tuple[list[int], Optional[list[float]]]]:
    """Generate one response per prompt with shared settings: ``[(token_ids, log_probs or None), ...]``.

    Left-padded, so every prompt ends where generation starts. A response ends after its first eos token
    (kept, as vLLM keeps it) or at ``max_tokens``, or where ``interrupt`` stopped the batch.
    """
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt):] = 1
    greedy = sampling.temperature <= 0
    stop = None if sampling.ignore_eos else list(eos_ids)
    kwargs: dict[str, Any] = dict(
        max_new_tokens=sampling.max_tokens,
        min_new_tokens=sampling.max_tokens if sampling.ignore_eos else 0,
        do_sample=not greedy,
        repetition_penalty=sampling.repetition_penalty,
        eos_token_id=stop,
        pad_token_id=pad_id,
        output_logits=sampling.logprobs,
        return_dict_in_generate=True,
    )
    if interrupt is not None:
        from transformers import StoppingCriteriaList

        kwargs["stopping_criteria"] = StoppingCriteriaList([interrupt])
    if not greedy:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k if sampling.top_k > 0 else 0)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    generated = out.sequences[:, width:]
    steps = generated.shape[1]
    # Each response's length: through its first eos (inclusive), else every generated token.
    if stop:
        is_eos = torch.isin(generated, torch.tensor(stop, dtype=generated.dtype))
        first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, torch.full_like(generated[:, 0], steps))
    else:
        first = torch.full_like(generated[:, 0], steps)
    token_logprobs = None
    if sampling.logprobs:
        logits = torch.stack(out.logits, dim=1).float()  # (batch, steps, vocab), before any logits processor
        if not greedy:
            logits = logits / sampling.temperature
        token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)
    results = []
    for row in range(len(prompts)):
        n = int(first[row])
        ids = generated[row, :n].tolist()
        results.append((ids, None if token_logprobs is None else token_logprobs[row, :n].tolist()))
    return results


def request_seed(seed: int, global_steps: Optional[int], prompt_ids: list[int], occurrence: int) -> int:
    """The sampling seed of one request under full determinism: a stable hash (not Python's, which is salted per
    process) of the rollout seed, the weights' step, the prompt and the prompt's occurrence in that step."""
    text = f"{seed}|{global_steps}|{occurrence}|{','.join(map(str, prompt_ids))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**63 - 1)


def generate_seeded(model, prompt_ids: list[int], sampling: Sampling, seed: int, eos_ids: list[int], pad_id: int,
                    interrupt: Optional[Interrupt] = None) -> tuple[list[int], Optional[list[float]]]:
    """One request alone (no padding, so its numbers do not depend on other requests), sampled from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return generate_batch(model, [prompt_ids], sampling, eos_ids, pad_id, interrupt)[0]


class HFGenerationServer:
    """The server actor: one model in CPU memory, weights replaced by the trainer after each update.

    Args mirror verl's vLLM server where they mean the same: the rollout config (a ``RolloutConfig``), the
    actor's model config (``actor_rollout_ref.model``) and the replica's rank (which seeds its sampling).
    """

    def __init__(self, config, model_config, replica_rank: int = 0) -> None:
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        from recipe_apo.reward.truncation import end_token_ids

        self.config = config
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        self.seed = int(getattr(config, "seed", 0) or 0)
        self.full_determinism = bool(getattr(config, "full_determinism", False))
        self._occurrences: dict[tuple[int, ...], int] = {}  # full determinism: prompts seen at this weights' step
        # Partial rollouts: the gate new requests wait at, whether an abort turns them back, and the stop of the
        # generation under way.
        self._open: Optional[asyncio.Event] = None
        self._rejecting = False
        self._interrupt = Interrupt(float(os.environ.get(PACE_VARIABLE, "0") or 0))
        self._generating = 0
        hf_config = self.model_config.hf_config
        torch.manual_seed(self.seed + replica_rank)
        if "dummy" in str(config.load_format):
            # verl's default: random weights until the trainer's first weight sync, exactly as vLLM starts.
            self.model = AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.float32)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(
                self.model_config.local_path, config=hf_config, torch_dtype=torch.float32
            )
        self.model.eval()
        tokenizer = self.model_config.tokenizer
        self.eos_ids = sorted(end_token_ids(tokenizer, self.model_config.generation_config))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.global_steps: Optional[int] = None
        self._pending: list[_Request] = []
        self._arrived: Optional[asyncio.Event] = None
        self._worker: Optional[asyncio.Task] = None
        self._http = None  # (aiohttp runner, "host:port") once serve_http has run

    # ---- generation -------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       image_data=None, video_data=None, audio_data=None, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None or audio_data is not None:
            raise RehearsalUnsupported("the CPU rehearsal's hf rollout generates text only (no images, video, audio)")
        extra = sorted(k for k, v in kwargs.items() if v not in (None, 0, {}, []))
        if extra:
            raise RehearsalUnsupported(f"the CPU rehearsal's hf rollout does not support {', '.join(extra)}")
        prompt_ids = [int(t) for t in prompt_ids]
        sampling = self._sampling(sampling_params, len(prompt_ids))
        if not await self._admitted():  # aborted with reject_request=True: turned back, the client retries
            return TokenOutput(token_ids=[], log_probs=[] if sampling.logprobs else None, stop_reason="aborted",
                               extra_fields={"global_steps": self.global_steps})
        version = self.global_steps
        token_ids, log_probs = await self._submit(prompt_ids, sampling)
        aborted = not ended(token_ids, sampling, self.eos_ids)
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason="aborted" if aborted else "completed",
                           extra_fields={"global_steps": version})

    async def _admitted(self) -> bool:
        """Wait at the gate an abort closed; False when the abort turns requests back."""
        if self._open is None:
            self._open = asyncio.Event()
            self._open.set()
        if not self._open.is_set() and self._rejecting:
            return False
        await self._open.wait()
        return True

    async def chat_completion(self, body: Any) -> dict:
        """One OpenAI chat completion (``chat_http``'s request and response), greedy or sampled as asked."""
        request = chat_http.parse_request(body)
        tokenizer = self.model_config.tokenizer
        # As vLLM's chat endpoint: the template writes the special tokens, so tokenizing must not add more.
        text = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        token_ids, _ = await self._submit(prompt_ids, self._sampling(request.sampling_params, len(prompt_ids)))
        stopped = bool(token_ids) and token_ids[-1] in self.eos_ids
        return chat_http.completion(request.model, tokenizer.decode(token_ids, skip_special_tokens=True),
                                    "stop" if stopped else "length", len(prompt_ids), len(token_ids))

    async def serve_http(self) -> str:
        """Start the chat-completions endpoint on this node (once); its ``host:port``."""
        if self._http is None:
            import ray

            self._http = await chat_http.serve(self.chat_completion, ray.util.get_node_ip_address())
        return self._http[1]

    def _sampling(self, params: dict[str, Any], prompt_len: int) -> Sampling:
        return Sampling.from_verl(dict(params), prompt_len, int(self.config.response_length),
                                  int(self.config.prompt_length), getattr(self.config, "max_model_len", None))

    async def _submit(self, prompt_ids: list[int], sampling: Sampling) -> tuple[list[int], Optional[list[float]]]:
        """Queue one request for the next batch; its ``(token_ids, log_probs or None)``."""
        loop = asyncio.get_running_loop()
        if self._worker is None:
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._serve())
        request = _Request(prompt_ids, sampling, loop.create_future())
        self._pending.append(request)
        self._arrived.set()
        return await request.done

    async def _serve(self) -> None:
        while True:
            await self._arrived.wait()
            # Let the rest of this wave of requests arrive: the agent loop sends a step's requests together.
            await asyncio.sleep(0.01)
            self._arrived.clear()
            # At most rollout.max_num_seqs at a time, as vLLM schedules: the rest wait for the next batch.
            cap = int(getattr(self.config, "max_num_seqs", 0) or 0) or len(self._pending)
            batch, self._pending = self._pending[:cap], self._pending[cap:]
            if self._pending:
                self._arrived.set()
            if self.full_determinism:
                await self._serve_one_by_one(batch)
                continue
            groups: dict[Sampling, list[_Request]] = {}
            for request in batch:
                groups.setdefault(request.sampling, []).append(request)
            for sampling, requests in groups.items():
                if self._interrupt.stop.is_set():  # aborted before its turn: nothing generated
                    for request in requests:
                        if not request.done.done():
                            request.done.set_result(([], [] if sampling.logprobs else None))
                    continue
                try:
                    self._generating += 1
                    results = await asyncio.to_thread(
                        generate_batch, self.model, [r.prompt_ids for r in requests], sampling, self.eos_ids,
                        self.pad_id, self._interrupt,
                    )
                except Exception as exc:  # hand the error to every caller instead of killing the loop
                    for request in requests:
                        if not request.done.done():
                            request.done.set_exception(exc)
                    continue
                finally:
                    self._generating -= 1
                for request, result in zip(requests, results):
                    if not request.done.done():
                        request.done.set_result(result)

    async def _serve_one_by_one(self, batch: list[_Request]) -> None:
        for request in batch:
            key = tuple(request.prompt_ids)
            occurrence = self._occurrences.get(key, 0)
            self._occurrences[key] = occurrence + 1
            seed = request_seed(self.seed, self.global_steps, request.prompt_ids, occurrence)
            if self._interrupt.stop.is_set():
                request.done.set_result(([], [] if request.sampling.logprobs else None))
                continue
            try:
                self._generating += 1
                result = await asyncio.to_thread(generate_seeded, self.model, request.prompt_ids, request.sampling,
                                                 seed, self.eos_ids, self.pad_id, self._interrupt)
            except Exception as exc:
                if not request.done.done():
                    request.done.set_exception(exc)
                continue
            finally:
                self._generating -= 1
            if not request.done.done():
                request.done.set_result(result)

    def _set_step(self, global_steps: Optional[int]) -> None:
        if global_steps is not None and global_steps != self.global_steps:
            self._occurrences.clear()
            self.global_steps = global_steps

    # ---- weights ------------------------------------------------------------------------------------------
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: Optional[int] = None) -> None:
        """Load the trainer's weights (HF parameter names); refuse names the model does not have."""
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        if unexpected or set(missing) - tied:
            raise RehearsalUnsupported(
                f"weight sync: the trainer's weights do not match the rollout model (unexpected: "
                f"{sorted(unexpected)[:3]}, missing: {sorted(set(missing) - tied)[:3]})"
            )
        if tied:
            self.model.tie_weights()
        self._set_step(global_steps)

    async def set_global_steps(self, global_steps: int) -> None:
        self._set_step(global_steps)

    # ---- the rest of verl's server interface: the model lives in CPU memory and is never released ----------
    async def wake_up(self, tags: Optional[list[str]] = None) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def clear_kv_cache(self) -> None:
        pass  # HF generate keeps no cache between calls

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Close the gate, stop the generation under way and answer every queued or running request with what it
        has (``stop_reason="aborted"``); returns once nothing generates."""
        if self._open is None:
            self._open = asyncio.Event()
        self._open.clear()
        self._rejecting = reject_request
        self._interrupt.stop.set()
        count = len(self._pending) + self._generating
        while self._pending or self._generating:
            await asyncio.sleep(0.005)
        return {"aborted_count": count, "request_ids": []}

    async def resume_generation(self) -> None:
        self._interrupt.stop.clear()
        self._rejecting = False
        if self._open is None:
            self._open = asyncio.Event()
        self._open.set()

    async def start_profile(self, **kwargs) -> None:
        pass

    async def stop_profile(self) -> None:
        pass
