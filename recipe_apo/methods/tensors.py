"""Tensors for the estimators: their new (batch, response_len) outputs, and vectors of batch size to and from
numpy.

An estimator's output is the one large allocation of its call (verl's int64 mask times a value per row: 128 MiB
of float32 at 65,536 x 512), and it is fresh memory every call: the allocator maps it anew, and the kernel
faults it in page by page as the first write reaches it. With transparent huge pages in ``madvise`` mode (a
common default; ``always`` needs no asking) the kernel backs a region with 2 MiB pages only when asked: numpy
asks for its large arrays, torch only under ``THP_MEM_ALLOC_ENABLE=1``. ``empty_like`` asks, so the first write
faults in 2 MiB at a time instead of 4 KiB. The tensor is an ordinary torch tensor; only the backing of its
pages changes, and where the hint is unavailable (another OS, ``never`` mode, a GPU tensor) nothing does.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import torch

__all__ = ["empty_like", "from_float64", "to_numpy"]

_HUGE_PAGE = 2 << 20
# Hinted only above glibc's largest mmap threshold, where an allocation is a mapping of its own: the hint then
# reaches no other allocation's memory.
_MIN_BYTES = 32 << 20


def _madvise():
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _madvise()


def empty_like(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty_like(like, dtype=dtype)``, its pages not yet touched and, for a large CPU tensor, hinted to
    the kernel for huge pages (``madvise(MADV_HUGEPAGE)`` on the 2 MiB-aligned part of its memory)."""
    out = torch.empty_like(like, dtype=dtype)
    nbytes = out.numel() * out.element_size()
    if _MADVISE is not None and out.device.type == "cpu" and nbytes > _MIN_BYTES:
        start = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (out.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        _MADVISE(start, end - start, mmap.MADV_HUGEPAGE)  # a hint: a failure leaves ordinary pages
    return out


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
