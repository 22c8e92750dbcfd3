"""The testbed's policy: a small autoregressive GRU language model over the task's tokens, built from scratch.

``log_probs`` is the training forward (one pass over prompt + response, like the actor's forward in verl), unscaled
by any temperature (``log_probs_and_entropy`` adds each position's token entropy); ``sample`` generates token by
token from the same weights, at temperature 1 or at a temperature per row (AGPO's per-prompt tau_t). The trainer
recomputes the behaviour policy's log probabilities with ``log_probs`` after sampling, as verl recomputes
``old_log_prob`` with the actor, so the first update of a round is exactly on-policy (ratio 1).

A method whose model has a residual logits head (``ModelParts.policy_head``: R2PO's rollout head) gives the policy one
(``add_residual_head``): its logits are then the base head's z or, with ``logits_head`` ``roll`` (the default once
added: sampling draws from it), z + delta(h) on the GRU's output h, both entering the residual detached so that a
loss on them trains the residual alone; ``select_logits_head`` picks one for a pass. The evaluation samples the
base head, the model a user keeps.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import nn

from recipe_apo.methods.base import BASE_HEAD, ROLLOUT_HEAD
from recipe_apo.testbed.task import EOS, PAD, SEP, Task


class TokenPolicy(nn.Module):
    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.rnn = nn.GRU(embed_dim, hidden_dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden_dim, vocab_size)
        # PAD and SEP are never a response token: masking them keeps every response inside the verifier's
        # vocabulary (symbols, FILL, EOS) and lets PAD mark "after the end" unambiguously.
        banned = torch.zeros(vocab_size)
        banned[[PAD, SEP]] = float("-inf")
        self.register_buffer("banned", banned, persistent=False)
        self.residual: Optional[nn.Module] = None
        self.logits_head = BASE_HEAD

    def add_residual_head(self, residual: nn.Module) -> None:
        """A residual logits head delta(h) (the module's docstring); the policy then samples z + delta."""
        self.residual = residual
        self.logits_head = ROLLOUT_HEAD

    @contextlib.contextmanager
    def select_logits_head(self, name: str) -> Iterator[None]:
        """The logits are ``name``'s (``base`` or, with a residual head, ``roll``) while held."""
        if name not in (BASE_HEAD, ROLLOUT_HEAD) or (name == ROLLOUT_HEAD and self.residual is None):
            raise ValueError(f"logits head {name!r}: the policy has {BASE_HEAD!r}"
                             + (f" and {ROLLOUT_HEAD!r}" if self.residual is not None else " only"))
        previous, self.logits_head = self.logits_head, name
        try:
            yield
        finally:
            self.logits_head = previous

    def step_logits(self, tokens: torch.Tensor, state: torch.Tensor | None = None):
        out, state = self.rnn(self.embed(tokens), state)
        logits = self.head(out)
        if self.residual is not None and self.logits_head == ROLLOUT_HEAD:
            logits = logits.detach() + self.residual(out.detach())
        return logits + self.banned, state

    def log_probs(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """log pi(o_t | x, o_<t) for every response position, [n, L0]; 0 after the end token.

        The zeros matter: PAD has probability 0 (log -inf), and -inf times a 0 mask is NaN in any loss.
        """
        return self._log_probs(prompts, responses, entropy=False)[0]

    def log_probs_and_entropy(self, prompts: torch.Tensor, responses: torch.Tensor):
        """(``log_probs``, the token entropy -sum_v pi(v) ln pi(v) at every response position [n, L0]), both of the
        unscaled distribution; the entropy after the end token is of no token (mask it)."""
        return self._log_probs(prompts, responses, entropy=True)

    def _log_probs(self, prompts: torch.Tensor, responses: torch.Tensor, entropy: bool):
        tokens = torch.cat([prompts, responses[:, :-1]], dim=1)
        logits, _ = self.step_logits(tokens)
        logits = logits[:, prompts.shape[1] - 1 :]
        padding = responses == PAD
        picked = torch.where(padding, torch.full_like(responses, EOS), responses)
        all_log_probs = torch.log_softmax(logits, dim=-1)
        log_probs = all_log_probs.gather(2, picked.unsqueeze(2)).squeeze(2).masked_fill(padding, 0.0)
        if not entropy:
            return log_probs, None
        # Banned tokens have log-probability -inf and probability 0: they add 0, not 0 * -inf (NaN).
        finite = all_log_probs.masked_fill(~torch.isfinite(all_log_probs), 0.0)
        return log_probs, -(all_log_probs.exp() * finite).sum(dim=-1)

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, max_len: int, generator: torch.Generator,
               temperature: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Responses [n, max_len]: sampled at temperature 1, or row i from softmax(logits / temperature[i])
        (``temperature``: [n], > 0); PAD after the end token."""
        logits, state = self.step_logits(prompts)
        n = prompts.shape[0]
        scale = None
        if temperature is not None:
            scale = torch.as_tensor(temperature, dtype=logits.dtype).reshape(-1, 1)
            if scale.shape[0] != n or not bool((scale > 0).all()) or not bool(torch.isfinite(scale).all()):
                raise ValueError(f"sample: temperature needs one finite value > 0 per row ({n}), got "
                                 f"{tuple(scale.shape)}")
        out = torch.full((n, max_len), PAD, dtype=torch.int64)
        done = torch.zeros(n, dtype=torch.bool)
        for t in range(max_len):
            step = logits[:, -1] if scale is None else logits[:, -1] / scale
            token = torch.multinomial(torch.softmax(step, dim=-1), 1, generator=generator).squeeze(1)
            token = torch.where(done, torch.full_like(token, PAD), token)
            out[:, t] = token
            done = done | (token == EOS)
            if bool(done.all()):
                break
            logits, state = self.step_logits(token.unsqueeze(1), state)
        return out


def response_mask(responses: torch.Tensor) -> torch.Tensor:
    """1 on response tokens up to and including the end token (all L0 tokens of a cut response)."""
    return (responses != PAD).to(torch.float32)


def build_policy(task: Task, embed_dim: int, hidden_dim: int, layers: int, seed: int) -> TokenPolicy:
    torch.manual_seed(seed)
    return TokenPolicy(task.vocab_size, embed_dim, hidden_dim, layers)


def pretrain(
    policy: TokenPolicy,
    task: Task,
    steps: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
) -> list[float]:
    """Brief supervised warm-up on filler-padded demonstrations: the "base model" RL starts from.

    Stopped early on purpose: the policy then solves short strings often and long ones rarely, and its
    answers carry fillers, so they are long and of varying length.
    """
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        prompts, k = task.sample_prompts(batch_size, generator)
        responses, fits = task.demonstrations(prompts, k, generator)
        mask = response_mask(responses) * fits.unsqueeze(1)
        nll = -(policy.log_probs(prompts, responses) * mask).sum() / mask.sum().clamp(min=1.0)
        optimizer.zero_grad(set_to_none=True)
        nll.backward()
        optimizer.step()
        losses.append(float(nll.detach()))
    return losses
