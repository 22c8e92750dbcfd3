"""The success indicator s(R) in [0, 1] (APO paper, section 4.4) that feeds y_t and p_hat_g."""

from __future__ import annotations

import numpy as np

from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.errors import BatchInputError

# Rewards summed over tokens in float32 can land a hair outside an exact bound.
_DOMAIN_TOLERANCE = 1e-5


def success_of(scores: np.ndarray, settings: ApoSettings) -> np.ndarray:
    """Map response rewards R_i (float64, shape (n,)) to successes s_i in [0, 1] (float64).

    Raises ``BatchInputError`` naming ``algorithm.apo.success`` when a reward lies outside the mapping's domain.
    """
    if settings.success == "threshold":
        return (scores > settings.success_threshold).astype(np.float64)
    if settings.success == "binary":
        low, high, hint = 0.0, 1.0, "binary (rewards used as they are)"
    else:
        low, high, hint = settings.success_min, settings.success_max, "minmax"
    outside = (scores < low - _DOMAIN_TOLERANCE) | (scores > high + _DOMAIN_TOLERANCE)
    if outside.any():
        rows = np.flatnonzero(outside)
        raise BatchInputError(
            f"{rows.size} of {scores.size} response rewards lie outside [{low}, {high}] required by "
            f"algorithm.apo.success={hint} (first rows {rows[:5].tolist()}, e.g. reward "
            f"{scores[rows[0]]:.6g}); set algorithm.apo.success=threshold with success_threshold, or "
            "success=minmax with success_min/success_max, to match your reward range"
        )
    if settings.success == "binary":
        return np.clip(scores, 0.0, 1.0)
    return np.clip((scores - low) / (high - low), 0.0, 1.0)
