"""The testbed's first verifiable task (``task=reverse``, the default): reverse a string of symbols, with
optional "thinking" filler tokens.

A prompt is k symbols (k from ``min_len`` to ``max_len``) followed by a separator; the answer is the same
symbols in reverse order, then an end token. The response may interleave FILL tokens anywhere: the verifier
ignores them, the way a math verifier ignores the chain of thought and reads only the final answer. So:

- difficulty spans "almost always" to "rarely" solved by the length k of the string (the policy has to carry
  k symbols through its state), and hard prompts need long correct answers;
- response length is partly the policy's free choice (how many fillers), so a bias that rewards or
  penalizes length by itself can move it without changing correctness;
- a response that reaches L0 tokens without the end token scores 0, as a truncated LLM answer does.

Everything is a batched tensor operation; nothing loops over prompts or responses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from recipe_apo.testbed.errors import TestbedSettingError

PAD, SEP, EOS, FILL = 0, 1, 2, 3
FIRST_SYMBOL = 4


@dataclass(frozen=True)
class ReverseTask:
    """Token layout: [PAD ... PAD s_1 ... s_k SEP] (left-padded to ``max_len + 1``), then the response."""

    alphabet: int
    min_len: int
    max_len: int
    max_response_length: int
    filler_mean: float

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len:
            raise TestbedSettingError(f"task.min_len={self.min_len}: needs 1 <= task.min_len <= task.max_len "
                                      f"({self.max_len})")
        if self.max_response_length < self.max_len + 1:
            raise TestbedSettingError(
                f"data.max_response_length={self.max_response_length}: must leave room for the longest answer "
                f"({self.max_len} symbols + end token)"
            )
        if self.alphabet < 2:
            raise TestbedSettingError(f"task.alphabet={self.alphabet}: must be >= 2")
        if not self.filler_mean >= 0:
            raise TestbedSettingError(f"task.filler_mean={self.filler_mean}: must be a finite number >= 0")

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.alphabet

    @property
    def prompt_width(self) -> int:
        return self.max_len + 1

    def describe(self) -> str:
        return f"strings of up to {self.max_len} symbols"

    def sample_prompts(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompts [n, max_len + 1], string lengths k [n]); k uniform over [min_len, max_len]."""
        k = torch.randint(self.min_len, self.max_len + 1, (n,), generator=generator)
        return self._prompts_of(k, generator), k

    def stratified_prompts(self, per_length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``per_length`` prompts of each length k: an evaluation set that covers every difficulty alike."""
        k = torch.arange(self.min_len, self.max_len + 1).repeat_interleave(per_length)
        return self._prompts_of(k, generator), k

    def _prompts_of(self, k: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        n = k.shape[0]
        symbols = torch.randint(0, self.alphabet, (n, self.max_len), generator=generator) + FIRST_SYMBOL
        valid = torch.arange(self.max_len).unsqueeze(0) >= (self.max_len - k).unsqueeze(1)
        body = torch.where(valid, symbols, torch.full_like(symbols, PAD))
        return torch.cat([body, torch.full((n, 1), SEP, dtype=body.dtype)], dim=1)

    def answers(self, prompts: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The reversed strings, left-aligned in [n, max_len], PAD beyond k."""
        reversed_body = prompts[:, : self.max_len].flip(1)
        keep = torch.arange(self.max_len).unsqueeze(0) < k.unsqueeze(1)
        return torch.where(keep, reversed_body, torch.full_like(reversed_body, PAD))

    def score(self, prompts: torch.Tensor, k: torch.Tensor, responses: torch.Tensor) -> dict[str, torch.Tensor]:
        """Verify responses [n, L0] (PAD after the end token).

        Returns ``reward`` (1.0 iff the end token came within L0 and the non-filler tokens before it are the
        reversed string), ``length`` (tokens including the end token; L0 when cut), ``cut`` (no end token) and
        ``fillers`` (filler tokens before the end: the part of a correct answer's length the policy chooses, as
        opposed to the string's length, which the prompt fixes).
        """
        ended, before_end, length = answer_span(responses)
        content, packed = _content(responses, before_end)
        target = self.answers(prompts, k)
        # L0 > max_len (checked above), so the first max_len packed tokens hold the whole answer when it has
        # exactly k symbols.
        correct = ended & (content.sum(dim=1) == k) & (packed[:, : self.max_len] == target).all(dim=1)
        fillers = (before_end & ~content).sum(dim=1)
        return {"reward": correct.to(torch.float32), "length": length, "cut": ~ended, "fillers": fillers}

    def vote_key(self, prompts: torch.Tensor, k: torch.Tensor, responses: torch.Tensor) -> np.ndarray:
        """The answer each response [n, L0] votes for in AGPO's vote entropy H_v (``method=agpo_dual``), a string
        per response: the symbols before the end token with the fillers left out, as the verifier reads them
        (``a`` for the first symbol, ``b`` the next ...: the reversal of ``a b`` answered as ``FILL b a EOS`` is
        ``ba``); a cut response has no answer and votes for its own text, ``~`` then every token (``.`` a
        filler), as AGPO's math rule lets an answerless response vote for its text."""
        ended, before_end, _ = answer_span(responses)
        _, packed = _content(responses, before_end)
        answer = torch.where(packed >= FIRST_SYMBOL, packed - FIRST_SYMBOL + ord("a"), torch.zeros_like(packed))
        text = torch.where(responses >= FIRST_SYMBOL, responses - FIRST_SYMBOL + ord("a"),
                           torch.full_like(responses, ord(".")))
        text = torch.cat([torch.full_like(text[:, :1], ord("~")), text], dim=1)
        return np.where(ended.numpy(), decode(answer), decode(text))

    def demonstrations(
        self, prompts: torch.Tensor, k: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Correct answers with a geometric number of fillers (mean ``filler_mean``) before each symbol.

        They give the pretrained policy long, varied answers (so length matters from the start). Returns
        (responses [n, L0], fits [n]); a demonstration longer than L0 does not fit and is left out.
        """
        return with_fillers(self.answers(prompts, k), k, self.filler_mean, self.max_response_length, generator)


class Task(Protocol):
    """What the testbed needs of a task (``ReverseTask``, ``recipe_apo.testbed.modsum.ModSumTask``).

    ``k`` is a prompt's difficulty parameter (the string length, the modulus): larger is harder, and it breaks
    ties when the evaluation set is cut into difficulty thirds.
    """

    max_response_length: int

    @property
    def vocab_size(self) -> int: ...

    def sample_prompts(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]: ...

    def stratified_prompts(self, per_length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ...

    def score(self, prompts: torch.Tensor, k: torch.Tensor, responses: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def demonstrations(
        self, prompts: torch.Tensor, k: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def describe(self) -> str: ...

    def vote_key(self, prompts: torch.Tensor, k: torch.Tensor, responses: torch.Tensor) -> np.ndarray: ...


def decode(codes: torch.Tensor) -> np.ndarray:
    """One string per row of ``codes`` [n, m] (Unicode code points; 0 = no character, only after the last one),
    without a loop over the rows: numpy reads the rows' code points as fixed-width strings."""
    n, m = codes.shape
    if m == 0:
        return np.full(n, "", dtype="<U1")
    points = np.ascontiguousarray(codes.numpy().astype(np.uint32))
    return points.view(f"<U{m}").reshape(n)


def _content(responses: torch.Tensor, before_end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(content [n, L0]: the symbol tokens before the end, packed [n, L0]: those tokens moved to the front in
    their order, PAD after them: the filler-free answer)."""
    width = responses.shape[1]
    content = before_end & (responses >= FIRST_SYMBOL)
    # A stable sort moves the content tokens to the front in their order.
    order = torch.sort((~content).to(torch.int8), dim=1, stable=True).indices
    packed = torch.where(
        torch.arange(width).unsqueeze(0) < content.sum(dim=1, keepdim=True),
        responses.gather(1, order),
        torch.full_like(responses, PAD),
    )
    return content, packed


def answer_span(responses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each response [n, L0] ends: (ended [n]: an end token came within L0, before_end [n, L0]: the
    positions before it (all L0 of a cut response), length [n]: tokens including the end token, L0 when cut)."""
    width = responses.shape[1]
    is_eos = responses == EOS
    ended = is_eos.any(dim=1)
    eos_at = torch.where(ended, is_eos.to(torch.int64).argmax(dim=1), torch.full((len(responses),), width))
    before_end = torch.arange(width).unsqueeze(0) < eos_at.unsqueeze(1)
    return ended, before_end, torch.where(ended, eos_at + 1, torch.full_like(eos_at, width))


def with_fillers(
    target: torch.Tensor, k: torch.Tensor, filler_mean: float, width: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Answers ``target`` [n, m] (the first ``k`` tokens of each row) with a geometric number of FILL tokens
    (mean ``filler_mean``) before each token, then the end token, PAD after. Returns (responses [n, width],
    fits [n]): a row longer than ``width`` does not fit."""
    n, m = target.shape
    if filler_mean > 0:
        keep_prob = 1.0 / (1.0 + filler_mean)
        u = torch.rand((n, m), generator=generator).clamp(min=1e-12)
        fillers = torch.floor(torch.log(u) / math.log(1.0 - keep_prob)).to(torch.int64).clamp(max=width)
    else:
        fillers = torch.zeros((n, m), dtype=torch.int64)
    in_answer = torch.arange(m).unsqueeze(0) < k.unsqueeze(1)
    slot_len = (fillers + 1) * in_answer
    slot_end = slot_len.cumsum(dim=1)
    total = slot_end[:, -1]
    t = torch.arange(width).unsqueeze(0)
    slot = (t.unsqueeze(2) >= slot_end.unsqueeze(1)).sum(dim=2)
    slot_c = slot.clamp(max=m - 1)
    is_symbol = (t == slot_end.gather(1, slot_c) - 1) & (slot < k.unsqueeze(1))
    responses = torch.where(is_symbol, target.gather(1, slot_c), torch.full_like(slot_c, FILL))
    responses = torch.where(t == total.unsqueeze(1), torch.full_like(responses, EOS), responses)
    responses = torch.where(t > total.unsqueeze(1), torch.full_like(responses, PAD), responses)
    return responses, total < width
