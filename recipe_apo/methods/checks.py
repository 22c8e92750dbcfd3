"""The input checks every method shares: settings (numbers, whole numbers, flags, choices), batches (shapes,
finite rewards, the response mask, the advantages' dtype and range), verl's list of loss aggregations and the
bounds of verl's own loss settings.

Each check raises with a one-line message that names the setting or the rows at fault: settings raise the
caller's ``error`` class (``ApoConfigError``, ``CodapoConfigError``, the integration's ``RecipeConfigError``),
batches ``BatchInputError``. A check returns nothing it did not check; a method adds its own wording of *why*
(which setting scales an overflow, say) in ``because``.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np
import torch

from recipe_apo.methods.errors import BatchInputError

__all__ = [
    "AGG_MODES", "L0_BOUNDS", "MASK_DTYPES", "NORM_MODE", "OWN_AGGREGATION", "RATIO_BAND", "TEMPERATURE_BOUNDS",
    "check_advantages", "check_choice", "check_finite", "check_flag", "check_integer", "check_loss_settings",
    "check_mask", "check_no_overflow", "check_number", "check_shapes", "effective_agg_mode", "output_dtype",
]

NORM_MODE = "seq-mean-token-sum-norm"
# verl 0.9.1's loss aggregations (core_algos.agg_loss), in its own order: the one list the recipe checks against.
AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", NORM_MODE)
# The ratio band of the "ratio outside band" metrics (the APO gate's, the testbed's): GRPO's default clip range, so
# the share reads like its clip fraction.
RATIO_BAND = 0.2
# Policy losses of verl 0.9.1 that aggregate their own way, whatever loss_agg_mode says. geo_mean never calls
# agg_loss: its torch.mean over sequences is seq-mean-token-mean's shape, but per micro-batch.
OWN_AGGREGATION = {"sapo": "seq-mean-token-mean", "geo_mean": "seq-mean-token-mean"}
# The gate's temperatures tau_+/-: the gate is (4 / tau) sigmoid(tau (r - 1)); below about 1e-38 it turns NaN and
# 1e-40 made a loss -inf, far above 1e3 its slope vanishes for every ratio off 1. The paper's are 1-1.5.
TEMPERATURE_BOUNDS = (1e-3, 1e3)
# L0, a number of tokens dividing every response's summed loss: below 1 it multiplies instead (1e-40 gave -inf),
# above 1e7 (longer than any response) the gradient underflows (1e300 gave 0).
L0_BOUNDS = (1.0, 1e7)


def effective_agg_mode(loss_mode: Any, loss_agg_mode: Any) -> str:
    """The aggregation a policy loss really applies: ``loss_agg_mode``, unless the loss has its own (verl's sapo)."""
    return OWN_AGGREGATION.get(str(loss_mode), str(loss_agg_mode))


def _is_real(value: Any) -> bool:
    # JSON's true/false and YAML's quoted numbers are not numbers here: a setting of the wrong type is a typo.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(
    name: str,
    value: Any,
    error: type[Exception],
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` if it is a finite real number in the bounds, else ``error`` naming ``name``. ``true`` is not 1
    here, nor ``"1.5"`` 1.5."""
    if not _is_real(value) or not math.isfinite(value):
        raise error(f"{name} must be a finite number, got {value!r}")
    if low is not None and high is not None and (low_open or high_open):
        inside = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        if not inside:
            span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            raise error(f"{name} must be a number in {span}, got {value!r}")
    if low is not None and (value <= low if low_open else value < low):
        raise error(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and (value >= high if high_open else value > high):
        raise error(f"{name} must be {'<' if high_open else '<='} {high}, got {value!r}")
    return value


def check_integer(name: str, value: Any, error: type[Exception], low: Optional[int] = None,
                  high: Optional[int] = None) -> int:
    """``value`` if it is a whole number (an int, not a bool) in [low, high], else ``error`` naming ``name``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or \
            (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            raise error(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        if low is not None:
            raise error(f"{name} must be an integer >= {low}, got {value!r}")
        raise error(f"{name} must be an integer, got {value!r}")
    return int(value)


def check_flag(name: str, value: Any, error: type[Exception]) -> bool:
    """``value`` if it is a bool, else ``error`` naming ``name``. A quoted ``'false'`` is a non-empty string,
    which Python (and verl, which tests ``if flag:``) reads as true."""
    if not isinstance(value, bool):
        hint = " (a string: drop the quotes)" if isinstance(value, str) else ""
        raise error(f"{name} must be true or false, got {value!r}{hint}")
    return value


def check_choice(name: str, value: Any, choices: Sequence[str], error: type[Exception]) -> str:
    """``value`` if it is one of ``choices``, else ``error`` naming ``name`` and the choices."""
    if value not in choices:
        raise error(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def check_shapes(**tensors: torch.Tensor) -> None:
    """The named tensors are all (batch, response_len) of one shape, else ``BatchInputError`` naming them."""
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(shape != first for shape in shapes.values()):
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise BatchInputError(f"{listed} must all be (batch, response_len) of one shape")


def check_finite(values: np.ndarray, valid: np.ndarray, what: str, prefix: str = "token_level_rewards") -> None:
    """Every valid response's ``values`` (one per response) is finite, else ``BatchInputError`` counting the
    responses and naming the first rows. Padding rows (``valid`` false) may hold anything."""
    bad = valid & ~np.isfinite(values)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise BatchInputError(
            f"{prefix}: {rows.size} of {valid.size} responses have NaN/inf {what}, first rows {rows[:5].tolist()}"
        )


def output_dtype(token_level_rewards: torch.Tensor) -> torch.dtype:
    """The advantages' dtype: the rewards', or float32 for integer and bool rewards (verl's own scorers return
    ints): advantages are real numbers whatever the rewards' dtype."""
    return token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32


def check_no_overflow(largest: float, dtype: torch.dtype, prefix: str, because: str) -> None:
    """``largest`` (a bound on the advantages' magnitude; NaN and inf included) fits ``dtype``, else
    ``BatchInputError``: "<prefix>advantages would overflow <dtype> (max ...): <because>"."""
    limit = float(torch.finfo(dtype).max)
    if not largest <= limit:  # also catches inf and NaN
        raise BatchInputError(
            f"{prefix}advantages would overflow {str(dtype).removeprefix('torch.')} (max {limit:.3g}): {because}"
        )


# The masks' dtypes: verl's (an attention-mask slice, int64; bool) and those a model's dtype or a cast gives.
MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.float32, torch.float64)


def check_mask(response_mask: torch.Tensor, prefix: str = "") -> None:
    """The response mask is one verl hands over: bool, integer or float (half precision too), every value in
    [0, 1] (verl's are 0 and 1), else ``BatchInputError`` counting the responses and naming the first row.

    The estimators multiply each response's advantage by its mask row and read its sum as the response's length:
    a NaN there made NaN advantages, a value above 1 could take a finite advantage past its dtype's range. One
    ``aminmax`` pass (NaN propagates through it); the rows are looked for only when it fails; a bool mask is
    fine as it is."""
    mask = response_mask.detach()
    if mask.dtype not in MASK_DTYPES:
        raise BatchInputError(f"{prefix}response_mask is {str(mask.dtype).removeprefix('torch.')}: a mask is bool, "
                              "an integer (int8 to int64, uint8) or a float (float16, bfloat16, float32, float64), "
                              "0 or 1 per token")
    if mask.dtype == torch.bool or mask.numel() == 0:
        return
    low, high = torch.aminmax(mask)
    if bool(low >= 0) and bool(high <= 1):
        return
    bad = ~((mask >= 0) & (mask <= 1)).all(dim=-1)  # NaN fails both comparisons
    rows = np.flatnonzero(bad.cpu().numpy())
    row = mask[int(rows[0])]
    value = float(row[~((row >= 0) & (row <= 1))][0])
    raise BatchInputError(
        f"{prefix}response_mask: {rows.size} of {mask.shape[0]} responses have a mask value that is NaN, inf or "
        f"outside [0, 1], first rows {rows[:5].tolist()} (row {int(rows[0])} holds {value:g}); a mask is 0 or 1 "
        "per token"
    )


def check_advantages(method: str, values: np.ndarray, dtype: torch.dtype, because: str = "rescale the rewards",
                     response_mask: Optional[torch.Tensor] = None) -> None:
    """Each response's advantage (``values``, float64, one per response: the factor its mask row is multiplied by)
    is finite in ``dtype``, the advantages' dtype, else ``BatchInputError`` naming ``method`` and the first row;
    with ``response_mask``, ``check_mask`` of it first (for an estimator that has not checked it yet).

    With a mask in [0, 1] (``check_mask``) an advantage that fits its dtype stays finite on every token: rounding
    to the dtype and the product with the mask only move it toward 0. So finite inputs give finite outputs or this
    one line: float32 rewards near 3.4e38 centered without the std, or float16 rewards near 6e4, give advantages
    that are finite in float64 and not in the rewards' dtype."""
    if response_mask is not None:
        check_mask(response_mask, prefix=f"{method}: ")
    limit = float(torch.finfo(dtype).max)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(values) <= limit)  # NaN too
    if bad.any():
        rows = np.flatnonzero(bad)
        name = str(dtype).removeprefix("torch.")
        raise BatchInputError(
            f"{method}: the advantages of {rows.size} of {values.size} responses are not finite in {name} (max "
            f"{limit:.3g}), first row {int(rows[0])} (advantage {float(values[rows[0]]):.4g} in float64): {because}"
        )


def check_loss_settings(actor: Any, error: type[Exception], prefix: str = "actor_rollout_ref.actor.") -> None:
    """Refuses verl 0.9.1's loss settings of ``actor`` (its ``actor_rollout_ref.actor`` node), which every method's loss
    (or verl's own) reads, out of their bounds: a bad one trains (NaN or an inverted clip range) or asserts in the actor
    after Ray and the model load (clip_ratio_c <= 1: ``core_algos.compute_policy_loss_vanilla``).

    - ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``: eps of the clip range [1 - eps_low, 1 + eps_high], finite
      numbers >= 0 (low and high may be null: verl falls back to clip_ratio); eps_low <= 1 (above it 1 - eps_low < 0
      bounds no ratio, which is > 0); and a range that is more than the ratio 1 (eps_low + eps_high > 0);
    - ``clip_ratio_c``: the dual clip's bound on -A r for A < 0, a finite number > 1 (verl asserts so in the actor);
    - ``kl_loss_coef``: a finite number >= 0 (a negative one rewards moving away from the reference);
    - ``entropy_coeff``: a finite number (a negative one penalizes entropy, a choice some runs make).
    """
    get = actor.get
    ratio = check_number(prefix + "clip_ratio", get("clip_ratio", 0.2), error, low=0.0)
    eps = {}
    for key in ("clip_ratio_low", "clip_ratio_high"):
        value = get(key, None)
        eps[key] = ratio if value is None else check_number(prefix + key, value, error, low=0.0)
    low, high = eps["clip_ratio_low"], eps["clip_ratio_high"]
    if low > 1.0:
        raise error(f"{prefix}clip_ratio_low={low}: the clip range's lower end 1 - clip_ratio_low = {1 - low:g} "
                    "is below 0, no bound on a ratio (which is > 0); at most 1")
    if not low + high > 0:
        raise error(f"{prefix}clip_ratio_low={low} and clip_ratio_high={high}: the clip range [1 - low, 1 + high] "
                    "is the single ratio 1, which clips every token of every update; set one of them > 0")
    check_number(prefix + "clip_ratio_c", get("clip_ratio_c", 3.0), error, low=1.0, low_open=True)
    check_number(prefix + "kl_loss_coef", get("kl_loss_coef", 0.001), error, low=0.0)
    check_number(prefix + "entropy_coeff", get("entropy_coeff", 0.0), error)
