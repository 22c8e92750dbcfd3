"""The testbed's policy: a small autoregressive GRU language model over the task's tokens, built from scratch.

``log_probs`` is the training forward (one pass over prompt + response, like the actor's forward in verl);
``sample`` generates token by token from the same weights. The trainer recomputes the behaviour policy's log
probabilities with ``log_probs`` after sampling, as verl recomputes ``old_log_prob`` with the actor, so the
first update of a round is exactly on-policy (ratio 1).
"""

from __future__ import annotations

import torch
from torch import nn

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

    def step_logits(self, tokens: torch.Tensor, state: torch.Tensor | None = None):
        out, state = self.rnn(self.embed(tokens), state)
        return self.head(out) + self.banned, state

    def log_probs(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """log pi(o_t | x, o_<t) for every response position, [n, L0]; 0 after the end token.

        The zeros matter: PAD has probability 0 (log -inf), and -inf times a 0 mask is NaN in any loss.
        """
        tokens = torch.cat([prompts, responses[:, :-1]], dim=1)
        logits, _ = self.step_logits(tokens)
        logits = logits[:, prompts.shape[1] - 1 :]
        padding = responses == PAD
        picked = torch.where(padding, torch.full_like(responses, EOS), responses)
        log_probs = torch.log_softmax(logits, dim=-1).gather(2, picked.unsqueeze(2)).squeeze(2)
        return log_probs.masked_fill(padding, 0.0)

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, max_len: int, generator: torch.Generator) -> torch.Tensor:
        """Responses [n, max_len]: sampled at temperature 1, PAD after the end token."""
        logits, state = self.step_logits(prompts)
        n = prompts.shape[0]
        out = torch.full((n, max_len), PAD, dtype=torch.int64)
        done = torch.zeros(n, dtype=torch.bool)
        for t in range(max_len):
            token = torch.multinomial(torch.softmax(logits[:, -1], dim=-1), 1, generator=generator).squeeze(1)
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
