"""The testbed's second task (``task=modsum``): difficulty is the chance of a lucky success.

A prompt names a modulus K and a target t in [0, K); the response is a string of decimal digits, then the end
token, and scores 1 iff its digit sum mod K equals t (0 when cut at L0, or with no digit). A policy that writes
digits at random succeeds about 1/K of the time, so the prompts span "a coin flip" (K = 2) to "one lucky
group in four" (K = 32, groups of 8): the small-``p`` prompts of the paper's Proposition 1, whose rare
successes a group-relative estimator weighs least. In string reversal (``task.py``) a hard prompt is one the
policy cannot carry; here it can always be solved by luck, and skill (tracking the sum mod K) is what RL adds.

Token layout: [MOD_K TARGET_t SEP], then the response. Digits, FILL (ignored by the verifier) and the end token
are the response's vocabulary; a modulus or target token in a response makes it malformed (reward 0).
Everything is a batched tensor operation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.task import EOS, FILL, FIRST_SYMBOL, PAD, SEP, answer_span, decode, with_fillers

DIGITS = 10
FIRST_DIGIT = FIRST_SYMBOL


@dataclass(frozen=True)
class ModSumTask:
    """``moduli``: the values of K, drawn uniformly; ``prefix_max``: a demonstration starts with 0..prefix_max
    random digits, then the fewest digits (nines, then one more) that bring the sum to t mod K."""

    moduli: tuple[int, ...]
    max_response_length: int
    filler_mean: float
    prefix_max: int

    def __post_init__(self) -> None:
        whole = all(isinstance(m, int) and not isinstance(m, bool) and m >= 2 for m in self.moduli)
        if not self.moduli or not whole or len(set(self.moduli)) != len(self.moduli):
            raise TestbedSettingError(f"task.moduli={list(self.moduli)}: must be distinct whole numbers >= 2")
        if self.prefix_max < 0:
            raise TestbedSettingError(f"task.prefix_max={self.prefix_max}: must be >= 0")
        if not self.filler_mean >= 0:
            raise TestbedSettingError(f"task.filler_mean={self.filler_mean}: must be a finite number >= 0")
        if self.max_response_length < self.max_digits + 1:
            raise TestbedSettingError(
                f"data.max_response_length={self.max_response_length}: must leave room for the longest "
                f"demonstration ({self.max_digits} digits + end token)"
            )

    @property
    def max_digits(self) -> int:
        # Prefix, then at most (K - 1) // 9 nines and one digit below 9.
        return self.prefix_max + (max(self.moduli) - 1) // 9 + 1

    @property
    def first_modulus(self) -> int:
        return FIRST_DIGIT + DIGITS

    @property
    def first_target(self) -> int:
        return self.first_modulus + len(self.moduli)

    @property
    def vocab_size(self) -> int:
        return self.first_target + max(self.moduli)

    def describe(self) -> str:
        return f"digit sums mod K in {{{', '.join(str(m) for m in self.moduli)}}}"

    def _prompts_of(self, k: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        moduli = torch.tensor(self.moduli)
        target = (torch.rand(k.shape, generator=generator, dtype=torch.float64) * k).floor().to(torch.int64)
        index = (k.unsqueeze(1) == moduli.unsqueeze(0)).to(torch.int64).argmax(dim=1)
        return torch.stack([self.first_modulus + index, self.first_target + target,
                            torch.full_like(k, SEP)], dim=1)

    def sample_prompts(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompts [n, 3], moduli K [n]); K uniform over ``moduli``, t uniform over [0, K)."""
        k = torch.tensor(self.moduli)[torch.randint(0, len(self.moduli), (n,), generator=generator)]
        return self._prompts_of(k, generator), k

    def stratified_prompts(self, per_length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``per_length`` prompts of each modulus."""
        k = torch.tensor(self.moduli).repeat_interleave(per_length)
        return self._prompts_of(k, generator), k

    def targets(self, prompts: torch.Tensor) -> torch.Tensor:
        return prompts[:, 1] - self.first_target

    def score(self, prompts: torch.Tensor, k: torch.Tensor, responses: torch.Tensor) -> dict[str, torch.Tensor]:
        """``reward``, ``length``, ``cut`` and ``fillers`` as ``ReverseTask.score``; fillers counts every non-digit
        token before the end."""
        ended, before_end, length = answer_span(responses)
        digit = before_end & (responses >= FIRST_DIGIT) & (responses < FIRST_DIGIT + DIGITS)
        malformed = (before_end & ~digit & (responses != FILL)).any(dim=1)
        total = torch.where(digit, responses - FIRST_DIGIT, torch.zeros_like(responses)).sum(dim=1)
        correct = ended & ~malformed & digit.any(dim=1) & (total % k == self.targets(prompts))
        fillers = (before_end & ~digit).sum(dim=1)
        return {"reward": correct.to(torch.float32), "length": length, "cut": ~ended, "fillers": fillers}

    def vote_key(self, prompts: torch.Tensor, k: torch.Tensor, responses: torch.Tensor) -> np.ndarray:
        """The answer each response [n, L0] votes for in AGPO's vote entropy H_v (``method=agpo_dual``), a string
        per response: its digit sum mod K in decimal (what the verifier compares with t: ``35`` and ``8`` give
        the same answer to K = 4), and for a response without an answer (cut at L0, malformed, or no digit) its
        own text, ``~`` then every token (digits as themselves, ``.`` a filler, ``$`` the end token, ``?`` any
        other), as AGPO's math rule lets an answerless response vote for its text."""
        ended, before_end, _ = answer_span(responses)
        digit = before_end & (responses >= FIRST_DIGIT) & (responses < FIRST_DIGIT + DIGITS)
        malformed = (before_end & ~digit & (responses != FILL)).any(dim=1)
        total = torch.where(digit, responses - FIRST_DIGIT, torch.zeros_like(responses)).sum(dim=1)
        answered = (ended & ~malformed & digit.any(dim=1)).numpy()
        is_digit = (responses >= FIRST_DIGIT) & (responses < FIRST_DIGIT + DIGITS)
        text = torch.where(is_digit, responses - FIRST_DIGIT + ord("0"), torch.full_like(responses, ord("?")))
        text = torch.where(responses == FILL, torch.full_like(text, ord(".")), text)
        text = torch.where(responses == EOS, torch.full_like(text, ord("$")), text)
        text = torch.where(responses == PAD, torch.zeros_like(text), text)
        text = torch.cat([torch.full_like(text[:, :1], ord("~")), text], dim=1)
        residue = np.char.mod("%d", (total % k).numpy())
        return np.where(answered, residue, decode(text))

    def demonstrations(
        self, prompts: torch.Tensor, k: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Correct answers: 0..prefix_max random digits, then nines and one last digit that complete the sum to t
        mod K (a lone 0 when nothing is left to add to an empty prefix), with fillers as in reversal."""
        n, m = k.shape[0], self.max_digits
        prefix_len = torch.randint(0, self.prefix_max + 1, (n,), generator=generator)
        prefix = torch.randint(0, DIGITS, (n, m), generator=generator)
        j = torch.arange(m).unsqueeze(0)
        prefix = torch.where(j < prefix_len.unsqueeze(1), prefix, torch.zeros_like(prefix))
        needed = (self.targets(prompts) - prefix.sum(dim=1)) % k
        nines, last = needed // 9, needed % 9
        lone_zero = (prefix_len == 0) & (needed == 0)
        after = j - prefix_len.unsqueeze(1)  # position within the completion
        digits = torch.where(j < prefix_len.unsqueeze(1), prefix, torch.zeros_like(prefix))
        digits = torch.where((after >= 0) & (after < nines.unsqueeze(1)), torch.full_like(digits, 9), digits)
        digits = torch.where(after == nines.unsqueeze(1), last.unsqueeze(1).expand_as(digits), digits)
        length = prefix_len + nines + (last > 0).to(torch.int64) + lone_zero.to(torch.int64)
        return with_fillers(digits + FIRST_DIGIT, length, self.filler_mean, self.max_response_length, generator)
