"""AGPO's dual feedback settings, ``algorithm.agpo_dual``: the source's defaults (``wandugu/paper_agpo`` at 11e5596,
``hparams/finetuning_args.py`` and ``agpo/config.yaml``; their names in brackets). Symbols: ``controllers``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from recipe_apo.methods.checks import check_choice, check_integer, check_number
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.settings import read_settings

DISPERSIONS = ("std", "mad", "iqr")


class AgpoDualConfigError(MethodConfigError):
    """A setting under ``algorithm.agpo_dual`` is invalid; the message names the key."""


@dataclass(frozen=True)
class AgpoDualSettings:
    """``algorithm.agpo_dual``: the source's defaults (finetuning_args.py / agpo/config.yaml names in brackets)."""

    # G, probe samples per prompt [agpo_group_size; the training samples are verl's rollout.n].
    probe_samples: int = 8
    # tau_base, the probe's temperature and the centre of tau_t [agpo_tau_base]; the preset sets verl's
    # rollout.temperature to the same value (the actor's log-probs use it).
    base_temperature: float = 1.0
    # lambda in tau_t = tau_base (1 + lambda c) [agpo_lambda_temp].
    temperature_gain: float = 0.15
    min_temperature: float = 0.5  # [agpo_tau_min]
    max_temperature: float = 1.5  # [agpo_tau_max]
    # a, the weight of the new value in U_bar's and KL_bar's averages [ema_alpha].
    average_rate: float = 0.1
    # w_r, w_e, w_k: U's weights of sigma_p, H_v, |kappa| [agpo_w_r, agpo_w_e, agpo_w_k].
    weight_dispersion: float = 1.0
    weight_vote_entropy: float = 1.0
    weight_skewness: float = 0.0
    # sigma_p's estimator: std (Bessel), mad (1.4826 x median absolute deviation), iqr (IQR / 1.349)
    # [agpo_use_robust_dispersion]. sigma_p only: the source also divides the advantages by it, which the recipe
    # does not (they stay GRPO's; the size of the difference: docs/beside_apo.md, "Advantage").
    dispersion: str = "std"
    # eps_base, eps_min, eps_max [agpo_eps_base, agpo_eps_min, agpo_eps_max].
    clip_base: float = 0.2
    clip_min: float = 0.05
    clip_max: float = 0.4
    # alpha, gamma, delta, zeta of eps_p [agpo_alpha_var, agpo_gamma_stepkl, agpo_delta_probe_entropy,
    # agpo_zeta_skew].
    clip_dispersion: float = 1.0
    clip_kl: float = 0.5
    clip_vote_entropy: float = 0.1
    clip_skewness: float = 0.0
    # The bounds of H_pi / H_ref in eps_p [entropy_h_min, entropy_h_max].
    entropy_ratio_min: float = 0.5
    entropy_ratio_max: float = 1.5
    # The weight of the new H_pi in H_ref's average [entropy_ref_ema_alpha].
    entropy_ref_rate: float = 0.01
    # How a response's answer is found for H_v: null, the math default (recipe_apo.methods.agpo_dual.vote_keys: the last
    # \boxed{}, else the text after ####, else the last number, else the whole text), or "module:function"
    # taking a response's text and returning its key (a string).
    vote_key: Optional[str] = None

    def __post_init__(self) -> None:
        name = "algorithm.agpo_dual."
        check_integer(name + "probe_samples", self.probe_samples, AgpoDualConfigError, low=1, high=4096)
        positive = dict(low=0.0, low_open=True, high=100.0)
        check_number(name + "base_temperature", self.base_temperature, AgpoDualConfigError, **positive)
        check_number(name + "min_temperature", self.min_temperature, AgpoDualConfigError, **positive)
        check_number(name + "max_temperature", self.max_temperature, AgpoDualConfigError, **positive)
        if self.min_temperature > self.max_temperature:
            raise AgpoDualConfigError(f"algorithm.agpo_dual.min_temperature={self.min_temperature} is above "
                                      f"max_temperature={self.max_temperature}")
        if not self.min_temperature <= self.base_temperature <= self.max_temperature:
            # tau_t = clip(tau_base (1 + lambda c), min, max): a tau_base outside pins every prompt at a bound.
            raise AgpoDualConfigError(f"algorithm.agpo_dual.base_temperature={self.base_temperature} is outside "
                                      f"[min_temperature, max_temperature] = [{self.min_temperature}, "
                                      f"{self.max_temperature}]: every prompt's temperature would sit at a bound")
        check_number(name + "temperature_gain", self.temperature_gain, AgpoDualConfigError, low=0.0, high=100.0)
        for key in ("average_rate", "entropy_ref_rate"):
            check_number(name + key, getattr(self, key), AgpoDualConfigError, low=0.0, high=1.0, low_open=True)
        for key in ("weight_dispersion", "weight_vote_entropy", "weight_skewness", "clip_dispersion", "clip_kl",
                    "clip_vote_entropy", "clip_skewness"):
            check_number(name + key, getattr(self, key), AgpoDualConfigError, low=0.0, high=1e6)
        check_choice(name + "dispersion", self.dispersion, DISPERSIONS, AgpoDualConfigError)
        for key in ("clip_base", "clip_min", "clip_max"):
            check_number(name + key, getattr(self, key), AgpoDualConfigError, low=0.0, high=1.0, low_open=True,
                         high_open=True)
        if self.clip_min > self.clip_max:
            raise AgpoDualConfigError(f"algorithm.agpo_dual.clip_min={self.clip_min} is above clip_max={self.clip_max}")
        if not self.clip_min <= self.clip_base <= self.clip_max:
            # eps_p = clip(eps_base x (the entropy ratio, the vote entropy, over the dispersion and KL terms), eps_min,
            # eps_max): an eps_base outside pins the clip of every calm prompt (all terms near 1) at a bound.
            raise AgpoDualConfigError(f"algorithm.agpo_dual.clip_base={self.clip_base} is outside [clip_min, "
                                      f"clip_max] = [{self.clip_min}, {self.clip_max}]: every calm prompt's clip "
                                      "would sit at a bound")
        check_number(name + "entropy_ratio_min", self.entropy_ratio_min, AgpoDualConfigError, **positive)
        check_number(name + "entropy_ratio_max", self.entropy_ratio_max, AgpoDualConfigError, **positive)
        if self.entropy_ratio_min > self.entropy_ratio_max:
            raise AgpoDualConfigError(f"algorithm.agpo_dual.entropy_ratio_min={self.entropy_ratio_min} is above "
                                      f"entropy_ratio_max={self.entropy_ratio_max}")
        if self.vote_key is not None and (not isinstance(self.vote_key, str) or ":" not in self.vote_key):
            raise AgpoDualConfigError("algorithm.agpo_dual.vote_key must be null or 'module:function', "
                                      f"got {self.vote_key!r}")

    @classmethod
    def from_algorithm_config(cls, algorithm_config: Any) -> "AgpoDualSettings":
        """Read ``algorithm_config.agpo_dual`` (an OmegaConf node, a dict, or absent); unknown keys are refused."""
        return read_settings(cls, algorithm_config, "agpo_dual", AgpoDualConfigError)
