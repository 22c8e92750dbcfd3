"""Vectors of batch size to and from numpy, where the estimators do their per-response and per-group maths."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["from_float64", "to_numpy"]


# numpy rounds float64 to these with the IEEE rounding torch uses.
_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}


def to_numpy(vector: torch.Tensor) -> np.ndarray:
    """A vector of batch size as numpy (on the CPU), to compute on there rather than in torch: torch's ops on
    vectors of batch size are the ones that stall when another process holds a core (each op waits for all
    of torch's threads). numpy has no bfloat16; float32 holds every bfloat16 exactly."""
    vector = vector.detach().cpu()
    return (vector.float() if vector.dtype == torch.bfloat16 else vector).numpy()


def from_float64(values: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """float64 ``values`` as a tensor of ``dtype`` on ``device``, rounded as torch rounds.

    numpy rounds to float32 (for the reason of ``to_numpy``); half precision is left to torch, which rounds
    through float32 where numpy rounds directly, and the two can differ in the last bit.
    """
    if dtype in _NUMPY_FLOATS:
        return torch.from_numpy(values.astype(_NUMPY_FLOATS[dtype], copy=False)).to(device)
    return torch.from_numpy(values).to(device=device, dtype=dtype)
