"""AGPO with dual statistical feedback (arXiv 2605.20722, "Adaptive Group Policy Optimization"), its two
controllers as its code computes them (``wandugu/paper_agpo`` at 11e5596, ``src/llamafactory/train/agpo/
trainer.py``, cited below as T:line; defaults from ``hparams/finetuning_args.py`` and ``agpo/config.yaml``).

Symbols, per prompt p of a step, and their names here:

- Probe: G samples of p at tau_base, scored (T:634-643); their rewards give
  sigma_p (``dispersion``: Bessel std, or 1.4826 MAD, or IQR / 1.349, T:333-357),
  kappa (``skewness``: mean(((x - mean) / s)^3) sqrt(n (n - 1)) / (n - 2), s the Bessel std; 0 when s < 1e-6;
  clamped to +-10; T:386-400: not the textbook G1, which divides by the population std), and their answers give
  H_v (``vote_entropy``: -sum_a p_a ln p_a over the answers' keys, natural log, not normalised, T:359-368).
- U = w_r sigma_p + w_e H_v + w_k |kappa| (``uncertainty``).
- U_bar (``uncertainty_avg``), one scalar for the run: c = (U - U_bar) / (U_bar + 1e-8), then
  U_bar <- (1 - a) U_bar + a U with a = 0.1; while U_bar <= 1e-8 (the start) c = 0 and U_bar <- U (T:412-427).
  The prompts of a batch update it one after another, in batch order, as the source's loop over prompts does.
- tau_t = clip(tau_base (1 + lambda c), tau_min, tau_max) (``temperature``, T:429-435): p's training samples
  are drawn at tau_t.
- H_pi: the old policy's token entropy at tau_base (verl's actor divides the logits by rollout.temperature, which
  the preset sets to tau_base: unscaled only at the default tau_base 1.0, and never at the prompt's tau_t),
  averaged over the tokens of p's training responses pooled (T:683-690); H_ref (``entropy_ref``): H_pi's
  average, H_ref <- 0.99 H_ref + 0.01 H_pi after each prompt's clip, started at the first H_pi (T:687, 706-710).
- eps_p = clip(eps_base clip(max(H_pi, 1e-8) / (max(H_ref, 1e-8) + 1e-8), 0.5, 1.5) (1 + delta H_v) /
  (1 + alpha sigma_p + gamma KL_bar + zeta |kappa|), eps_min, eps_max) (``clip_eps``, T:437-462): p's ratios
  are clipped to [1 - eps_p, 1 + eps_p] (``recipe_apo.methods.agpo_dual.loss``).
- KL_bar (``kl_avg``): after a step's update epochs, step_KL = mean over prompts of
  max(sum over p's tokens of (logp_old - logp_new) / their count, 0), and KL_bar <- 0.9 KL_bar + 0.1 step_KL
  (T:558-559, 796-815), starting at 0.

The source rounds tau, eps and the statistics through float32 tensors; so does this module, so that its values
are the source's to the bit on the transcribed cases (tests/methods/test_agpo_dual.py). Needs numpy and torch
only: the prompts' rewards and answer keys come in as arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from recipe_apo.methods.agpo_dual.settings import DISPERSIONS, AgpoDualConfigError, AgpoDualSettings
from recipe_apo.methods.errors import BatchInputError, MethodStateError
from recipe_apo.methods.state_codec import shown, unknown_keys

# The source's guards (agpo/config.yaml): U_bar's start test and c's denominator; H's floor in the ratio;
# skewness's std floor and clamp.
UNCERTAINTY_FLOOR = 1e-8
ENTROPY_FLOOR = 1e-8
SKEW_SIGMA_MIN = 1e-6
SKEW_MAX = 10.0
MAD_SCALE, IQR_SCALE = 1.4826, 1.349

# The largest value each state field can reach, what a restored state is held to. H_ref: an average of token
# entropies, each at most ln |V| (no tokenizer has 2^32 tokens). KL_bar: an average of step_KL, a mean of
# differences of two float32 log-probs. U_bar: an average of U = w_r sigma_p + w_e H_v + w_k |kappa|, the weights
# at most 1e6 (``AgpoDualSettings``), sigma_p a float32, H_v at most ln G (G <= 4096 probe samples), |kappa| <= 10.
FLOAT32_MAX = float(np.finfo(np.float32).max)
STATE_MAX = {"uncertainty_avg": 1e6 * (FLOAT32_MAX + math.log(4096) + SKEW_MAX),
             "entropy_ref": math.log(2.0**32),
             "kl_avg": 2 * FLOAT32_MAX}


def _f32(values: Any) -> np.ndarray:
    """Rounded to float32 and back, as the source's tensors round them."""
    return np.asarray(values, dtype=np.float32).astype(np.float64)


def _check_rewards(rewards: np.ndarray) -> np.ndarray:
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 2 or rewards.shape[1] == 0:
        raise BatchInputError(f"probe rewards must be (prompts, samples) with samples >= 1, got {rewards.shape}")
    if not np.isfinite(rewards).all():
        row = int(np.argwhere(~np.isfinite(rewards))[0][0])
        raise BatchInputError(f"probe rewards: prompt {row} has a non-finite reward")
    return rewards


def bessel_std(rewards: np.ndarray) -> np.ndarray:
    """Per row, the sample std (n - 1), in float32; 0 for rows of one value (T:333-337)."""
    x = torch.as_tensor(_check_rewards(rewards), dtype=torch.float32)
    if x.shape[1] < 2:
        return np.zeros(x.shape[0])
    return x.std(dim=1, unbiased=True).double().numpy()


def dispersion(rewards: np.ndarray, kind: str = "std") -> np.ndarray:
    """sigma_p per row (T:339-357): ``std``; ``mad`` 1.4826 x median |x - median| (torch's lower median for an
    even count); ``iqr`` (q75 - q25) / 1.349 (linear interpolation)."""
    x = torch.as_tensor(_check_rewards(rewards), dtype=torch.float32)
    if kind == "std":
        return bessel_std(rewards)
    if kind == "mad":
        median = x.median(dim=1, keepdim=True).values
        return (MAD_SCALE * (x - median).abs().median(dim=1).values).double().numpy()
    if kind == "iqr":
        q = torch.quantile(x, torch.tensor([0.75, 0.25]), dim=1)
        return ((q[0] - q[1]) / IQR_SCALE).double().numpy()
    raise AgpoDualConfigError(f"algorithm.agpo_dual.dispersion must be one of {', '.join(DISPERSIONS)}, got {kind!r}")


def skewness(rewards: np.ndarray) -> np.ndarray:
    """kappa per row (T:386-400): mean(((x - mean) / s)^3), s the Bessel std, times sqrt(n (n - 1)) / (n - 2)
    for n > 2; 0 where s < 1e-6; clamped to [-10, 10] (unreachable below 103 samples: |kappa| <= (n-1)^1.5/n)."""
    x = torch.as_tensor(_check_rewards(rewards), dtype=torch.float32)
    n = x.shape[1]
    s = x.std(dim=1, unbiased=True) if n > 1 else torch.zeros(x.shape[0])
    flat = s < SKEW_SIGMA_MIN
    z = (x - x.mean(dim=1, keepdim=True)) / torch.where(flat, torch.ones_like(s), s).unsqueeze(1)
    kappa = (z ** 3).mean(dim=1)
    if n > 2:
        kappa = kappa * math.sqrt(n * (n - 1)) / (n - 2)
    kappa = torch.where(flat, torch.zeros_like(kappa), kappa).clamp(-SKEW_MAX, SKEW_MAX)
    return kappa.double().numpy()


def vote_entropy(keys: Sequence[Sequence[str]]) -> np.ndarray:
    """H_v per prompt: -sum_a p_a ln max(p_a, 1e-12) over the distinct answer keys of its samples, in float32
    (T:359-368). A response without an answer has its whole text as its key (``vote_keys``), so H_v is defined for
    every prompt; no sample gives 0."""
    keys = [list(row) for row in keys]
    sizes = np.array([len(row) for row in keys])
    out = np.zeros(len(keys))
    if sizes.sum() == 0:
        return out
    prompt = np.repeat(np.arange(len(keys)), sizes)
    _, codes = np.unique(np.array([k for row in keys for k in row], dtype=object).astype(str), return_inverse=True)
    pairs, counts = np.unique(prompt * (codes.max() + 1) + codes, return_counts=True)
    owner = pairs // (codes.max() + 1)
    p = torch.as_tensor(counts / sizes[owner], dtype=torch.float32)
    terms = (p * torch.log(p.clamp_min(1e-12))).double().numpy()
    # summed per prompt in float32, as the source sums a float32 tensor
    sums = np.zeros(len(keys), dtype=np.float32)
    np.add.at(sums, owner, terms.astype(np.float32))
    return -sums.astype(np.float64)


@dataclass
class ProbeStats:
    """A step's probe statistics, one value per prompt (float arrays of equal length)."""

    dispersion: np.ndarray
    vote_entropy: np.ndarray
    skewness: np.ndarray

    @classmethod
    def of(cls, rewards: np.ndarray, keys: Sequence[Sequence[str]], kind: str = "std") -> "ProbeStats":
        return cls(dispersion(rewards, kind), vote_entropy(keys), skewness(rewards))

    def uncertainty(self, settings: AgpoDualSettings) -> np.ndarray:
        """U = w_r sigma_p + w_e H_v + w_k |kappa| per prompt."""
        return (settings.weight_dispersion * self.dispersion + settings.weight_vote_entropy * self.vote_entropy
                + settings.weight_skewness * np.abs(self.skewness))


@dataclass
class AgpoDualState:
    """What AGPO carries from step to step (driver state, checkpointed): U_bar, H_ref, KL_bar; 0 means "not
    started" for U_bar and H_ref, as in the source."""

    uncertainty_avg: float = 0.0
    entropy_ref: float = 0.0
    kl_avg: float = 0.0

    FIELDS = ("uncertainty_avg", "entropy_ref", "kl_avg")

    def temperatures(self, uncertainty: np.ndarray, settings: AgpoDualSettings) -> tuple[np.ndarray, np.ndarray]:
        """tau_t and c per prompt, moving U_bar prompt by prompt in batch order (T:412-435).

        A recurrence over the batch's prompts (one float each), not over responses: c of prompt j reads U_bar
        after prompt j - 1."""
        u_values = np.asarray(uncertainty, dtype=np.float64)
        centred = np.zeros(u_values.shape)
        a = settings.average_rate
        for j, u in enumerate(u_values.tolist()):
            avg = self.uncertainty_avg
            if avg <= UNCERTAINTY_FLOOR:
                self.uncertainty_avg = u
                continue
            centred[j] = (u - avg) / (avg + UNCERTAINTY_FLOOR)
            self.uncertainty_avg = a * u + (1.0 - a) * avg
        tau = settings.base_temperature * (1.0 + settings.temperature_gain * centred)
        return _f32(np.clip(_f32(tau), settings.min_temperature, settings.max_temperature)), centred

    def clips(self, entropy: np.ndarray, stats: ProbeStats,
              settings: AgpoDualSettings) -> tuple[np.ndarray, np.ndarray]:
        """eps_p and H_pi / H_ref (before the clamp) per prompt, moving H_ref prompt by prompt (T:683-710)."""
        h_values = np.asarray(entropy, dtype=np.float64)
        ref = np.empty(h_values.shape)
        rate = settings.entropy_ref_rate
        for j, h in enumerate(h_values.tolist()):
            current = self.entropy_ref if self.entropy_ref > ENTROPY_FLOOR else h
            ref[j] = current
            self.entropy_ref = h if self.entropy_ref <= ENTROPY_FLOOR else rate * h + (1.0 - rate) * self.entropy_ref
        ratio = np.maximum(h_values, ENTROPY_FLOOR) / (np.maximum(ref, ENTROPY_FLOOR) + ENTROPY_FLOOR)
        bounded = np.clip(_f32(ratio), settings.entropy_ratio_min, settings.entropy_ratio_max)
        eps = (settings.clip_base * bounded * (1.0 + settings.clip_vote_entropy * stats.vote_entropy)
               / (1.0 + settings.clip_dispersion * stats.dispersion + settings.clip_kl * self.kl_avg
                  + settings.clip_skewness * np.abs(stats.skewness)))
        return _f32(np.clip(_f32(eps), settings.clip_min, settings.clip_max)), ratio

    def add_step_kl(self, step_kl: float, settings: AgpoDualSettings) -> None:
        """KL_bar <- (1 - a) KL_bar + a step_KL, once per training step after its updates (T:558-559)."""
        if not math.isfinite(step_kl) or step_kl < 0:
            raise BatchInputError(f"AGPO's step KL must be a finite number >= 0, got {step_kl!r}")
        self.kl_avg = settings.average_rate * step_kl + (1.0 - settings.average_rate) * self.kl_avg

    def state_dict(self) -> dict[str, float]:
        return {key: float(getattr(self, key)) for key in self.FIELDS}

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict``'s output; anything else raises ``MethodStateError`` naming the part: a key
        the state does not have, a missing one, or a number outside what the controllers can reach (``STATE_MAX``)."""
        if not isinstance(state, dict):
            raise MethodStateError(f"AGPO state must hold exactly {', '.join(self.FIELDS)}, got a "
                                   f"{type(state).__name__}")
        unknown = unknown_keys(state, self.FIELDS)
        if unknown:
            raise MethodStateError(f"AGPO state holds keys the recipe does not write: {unknown}")
        missing = [key for key in self.FIELDS if key not in state]
        if missing:
            raise MethodStateError(f"AGPO state must hold exactly {', '.join(self.FIELDS)}; missing "
                                   f"{', '.join(missing)}")
        values = {}
        for key in self.FIELDS:
            value, high = state[key], STATE_MAX[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 <= value <= high:
                raise MethodStateError(f"AGPO state {key} must be a number in [0, {high:.6g}], got {shown(value)}")
            values[key] = float(value)
        for key, value in values.items():
            setattr(self, key, value)


def step_kl(old_log_probs: torch.Tensor, new_log_probs: torch.Tensor, response_mask: torch.Tensor,
            prompt_ids: np.ndarray) -> float:
    """step_KL: mean over prompts of max(pooled token mean of logp_old - logp_new over the prompt's responses,
    0) (T:796-815); rows without a valid token count for nothing; no prompt gives 0."""
    mask = response_mask.to(torch.float64)
    diff = ((old_log_probs.double() - new_log_probs.double()) * mask).sum(dim=-1).numpy()
    tokens = mask.sum(dim=-1).numpy()
    codes = np.unique(np.asarray(prompt_ids), return_inverse=True)[1].reshape(-1)
    sums = np.bincount(codes, weights=diff)
    counts = np.bincount(codes, weights=tokens)
    seen = counts > 0
    if not seen.any():
        return 0.0
    per_prompt = np.maximum(sums[seen] / counts[seen], 0.0)
    return float(per_prompt.mean())


def pooled_entropy(entropy: torch.Tensor, response_mask: torch.Tensor, prompt_ids: np.ndarray,
                   order: Sequence[Any]) -> np.ndarray:
    """H_pi per prompt of ``order``: the token entropy averaged over all of that prompt's valid response tokens
    (T:689: sum(H mask) / sum(mask)); a prompt without a token gets 0."""
    mask = response_mask.to(torch.float64)
    sums = (entropy.double() * mask).sum(dim=-1).numpy()
    tokens = mask.sum(dim=-1).numpy()
    index = {key: j for j, key in enumerate(order)}
    try:
        codes = np.array([index[key] for key in np.asarray(prompt_ids).tolist()], dtype=np.int64)
    except KeyError as exc:
        raise BatchInputError(f"a response of prompt {exc.args[0]!r} has no probe statistics") from None
    total = np.bincount(codes, weights=sums, minlength=len(order))
    count = np.bincount(codes, weights=tokens, minlength=len(order))
    return np.divide(total, count, out=np.zeros(len(order)), where=count > 0)
