"""Prompt groups, shared by every group estimator (APO, CoDaPO, the zero-variance scale) and the audit.

verl gives each response the uid of its prompt (``non_tensor_batch["uid"]``); the responses sharing a uid are
the prompt's group g. Here a group is a contiguous id 0..n_groups-1 per response (``codes``), so per-group sums
are one ``np.bincount`` and per-response lookups one fancy index: no Python loop over responses or groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from recipe_apo.methods.errors import BatchInputError

__all__ = ["centered_rewards", "group_codes", "group_ids", "group_mean", "group_range", "group_rates", "group_sums",
           "response_rewards"]


def group_ids(index: Any, batch_size: int) -> tuple[np.ndarray, int]:
    """Contiguous group ids 0..n_groups-1 (first-seen order, int64) for the per-response uid array ``index``.

    ``pandas.factorize`` hashes the uids: verl's uids are uuid strings, which a hash groups in one pass where
    ``np.unique`` would sort them. Raises ``BatchInputError`` for an array of the wrong shape (a list of lists of one
    length is 2-D), for missing uids (None, NaN) and for a uid that cannot name a group (a list).
    """
    labels = _labels(index)
    if labels.ndim != 1 or labels.shape[0] != batch_size:
        raise BatchInputError(
            f"index (the uid array) has shape {tuple(labels.shape)} but the batch has {batch_size} responses; "
            "pass one uid (a str or an int) per response"
        )
    try:
        codes, n_groups = _factorize(labels)
    except TypeError as exc:  # a label pandas cannot hash (a list, a dict): named here, in the error path only
        row = next((i for i, label in enumerate(labels) if not _hashable(label)), None)
        if row is None:
            raise BatchInputError(f"index (the uid array) cannot be grouped ({exc}); pass one uid (a str or an "
                                  "int) per response") from None
        raise BatchInputError(
            f"index (the uid array): the uid of row {row} is a {type(labels[row]).__name__}, which cannot name a "
            "group; pass one uid (a str or an int) per response, as verl's non_tensor_batch['uid']"
        ) from None
    if batch_size and codes.min() < 0:
        rows = np.flatnonzero(codes < 0)
        raise BatchInputError(f"index (the uid array) has {rows.size} missing uids, first rows {rows[:5].tolist()}")
    return codes.astype(np.int64, copy=False), n_groups


def _labels(index: Any) -> np.ndarray:
    """``index`` as a numpy array: verl's object array of uid strings, a numeric or str array, a list, a tensor.
    A list whose items are lists of different lengths, which numpy cannot make an array of, becomes a 1-D object
    array, so that ``group_ids`` names the item that is not a uid."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu()
        return (index.float() if index.dtype == torch.bfloat16 else index).numpy()
    try:
        return np.asarray(index)
    except ValueError:  # numpy >= 1.24 refuses ragged nested sequences
        return np.fromiter(index, dtype=object)


def _hashable(label: Any) -> bool:
    try:
        hash(label)
    except TypeError:
        return False
    return True


def _factorize(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """``pandas.factorize``'s codes and number of uniques, hashing only the first label of each run of equal ones.

    verl lays a group's responses out one after the other (``DataProto.repeat(interleave=True)``) unless
    ``trainer.balance_batch`` reorders the batch: then one comparison of neighbours finds the runs, and the
    hashing touches one uid per group instead of one per response. Labels equal to their neighbour are equal to
    pandas too (it hashes ``==``-equal values alike), so the codes are those of the whole array. Without runs,
    or with labels that cannot be compared (``pd.NA``), the whole array is hashed.
    """
    import pandas as pd  # on use: importing a method's declaration stays light (``recipe_apo.methods.catalog``)

    if labels.size > 1:
        starts = np.empty(labels.size, dtype=bool)
        starts[0] = True
        try:
            np.not_equal(labels[1:], labels[:-1], out=starts[1:])
        except Exception:  # any label's comparison may raise (pd.NA's does): pandas then decides alone
            starts[1:] = True
        heads = np.flatnonzero(starts)
        if 2 * heads.size <= labels.size:
            codes, uniques = pd.factorize(labels[heads])
            return np.repeat(codes, np.diff(heads, append=labels.size)), len(uniques)
    codes, uniques = pd.factorize(labels)
    return codes, len(uniques)


def group_codes(labels: Any) -> tuple[np.ndarray, int]:
    """``group_ids`` of a sequence of per-response group labels (its length is the batch size)."""
    labels = np.asarray(labels, dtype=object)
    return group_ids(labels, labels.shape[0])


def group_sums(codes: np.ndarray, n_groups: int, values: Any) -> np.ndarray:
    """Per-group sums of per-response ``values`` (float64)."""
    return np.bincount(codes, weights=np.asarray(values, dtype=np.float64), minlength=n_groups)


def group_rates(codes: np.ndarray, n_groups: int, values: Any) -> np.ndarray:
    """Per-group means of per-response ``values`` over every response of the group (p_hat_g for successes)."""
    counts = np.bincount(codes, minlength=n_groups)
    return group_sums(codes, n_groups, values) / np.maximum(counts, 1)


def group_range(codes: np.ndarray, n_groups: int, values: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the (lowest, highest) of ``values``; (inf, -inf) for a group with no value.

    A group's rewards are all equal when the two are: compared by min and max, not by the centered reward,
    since the mean of equal floats can differ from them in the last bit.
    """
    values = np.asarray(values, dtype=np.float64)
    low = np.full(n_groups, np.inf)
    high = np.full(n_groups, -np.inf)
    np.minimum.at(low, codes, values)
    np.maximum.at(high, codes, values)
    return low, high


def group_mean(codes: np.ndarray, weighted_values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-group sums of already-weighted values over per-group counts (float64); 0 for a group of count 0.

    The caller weights: values of padding rows are 0 and not counted, so they take no part in any mean.
    """
    sums = np.bincount(codes, weights=weighted_values, minlength=counts.size)
    return np.divide(sums, counts, out=np.zeros(counts.size), where=counts > 0)


def centered_rewards(scores: np.ndarray, w: np.ndarray, codes: np.ndarray, counts: np.ndarray, norm_adv_by_std: bool,
                     epsilon: float) -> np.ndarray:
    """GRPO's A_i: R_i - mean_g(R) over the group's valid responses (``w`` 1, padding 0), divided by
    (std_g + epsilon) with ``norm_adv_by_std`` (sample std, n - 1, as ``torch.std``); a group of one has mean 0
    and std 1 (A_i = R_i / (1 + epsilon)), as in CoDaPO's and AGPO's code. float64 throughout."""
    n_groups = counts.size
    mean = np.where(counts > 1, group_mean(codes, scores * w, counts), 0.0)
    if not norm_adv_by_std:
        return scores - mean[codes]
    squares = np.bincount(codes, weights=(scores - mean[codes]) ** 2 * w, minlength=n_groups)
    std = np.sqrt(np.divide(squares, counts - 1, out=np.ones(n_groups), where=counts > 1))
    std = np.where(counts > 1, std, 1.0)
    return (scores - mean[codes]) / (std[codes] + epsilon)


def response_rewards(token_level_rewards: torch.Tensor) -> np.ndarray:
    """R_i (float64, shape (n,)): the sum of each response's token-level rewards.

    Summed in the rewards' own dtype where that is exact enough (integers, bool, float32/64), in float32 for
    half precision (a float16 sum over a few thousand tokens would round), and not upcast to float64 over the
    whole (n, T) tensor: an upcasting sum converts every token, and only n sums need float64.
    """
    rewards = token_level_rewards.detach()
    if rewards.dtype in (torch.float16, torch.bfloat16):
        sums = rewards.sum(dim=-1, dtype=torch.float32)
    else:
        sums = rewards.sum(dim=-1)
    return sums.cpu().numpy().astype(np.float64, copy=False)
