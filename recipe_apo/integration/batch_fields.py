"""A step's fields in TransferQueue, read and written as verl's V1 trainer does (same keys, same padding).

In verl's V1 trainer a batch is a handle (``batch.keys``, ``batch.partition_id``); its fields live in
TransferQueue as nested (jagged) tensors. The hooks read them padded, as verl pads the rows it hands an
advantage estimator, and write advantages back nested.
"""

from __future__ import annotations

import numpy as np
import transfer_queue as tq

from recipe_apo.methods.errors import BatchInputError


def read(batch, fields: list[str]):
    """The ``fields`` of every row of ``batch``, in ``batch.keys`` order (a TensorDict)."""
    return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)


def write(batch, fields: dict, nested_like) -> None:
    """Store padded ``(n, T)`` tensors back as nested rows shaped like ``nested_like`` (a nested mask)."""
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    nested = {name: response_to_nested(value, nested_like) for name, value in fields.items()}
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                    fields=TensorDict(nested, batch_size=len(batch)))


def old_log_probs(batch):
    """The old policy's log-probs, padded as verl pads the rows it hands the estimator (same keys, order)."""
    return read(batch, ["old_log_probs"])["old_log_probs"].to_padded_tensor(padding=0.0)


def data_sources(batch) -> np.ndarray:
    """Each row's ``data_source``; ``BatchInputError`` naming the remedy when the dataset has none."""
    try:
        sources = read(batch, ["data_source"])["data_source"]
    except Exception as exc:  # the storage's own error types vary with its backend
        raise BatchInputError(
            f"algorithm.apo.anchor_scope=data_source: the batch has no data_source field ({exc}); "
            "add data_source to your dataset rows or use anchor_scope=global"
        ) from exc
    return np.asarray(sources.tolist() if hasattr(sources, "tolist") else list(sources), dtype=object)
