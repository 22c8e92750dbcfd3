"""The one format of a method runtime's state in a checkpoint folder: JSON, written atomically, read back checked.

A file holds ``{"kind": <method>, "global_step": <step>, **state}``, ``state`` being the runtime's ``state_dict``:
plain JSON values, and tensors or numpy arrays (CoDaPO's kept prompts), each written as
``{"__array__": <dtype>, "shape": [...], "data": [...]}`` and read back as a torch tensor of that dtype and shape.
Nothing is read back through pickle: a checkpoint folder someone else wrote cannot run code on the machine that
resumes from it.

Writing goes to a temporary file in the same folder, flushed and fsynced, then renamed, and the folder fsynced:
a crash mid-write leaves the previous file (or none), never a truncated one. Reading refuses, as a
``StateFileError`` whose message is one line (the caller adds the path): a missing file; anything but a regular
file once links are followed (a FIFO would block the read forever, ``/dev/zero`` would fill the memory: the file
is examined with ``stat`` and opened non-blocking, never read before both say it is a regular file); a file larger
than its bound (``MAX_STATE_BYTES``, or the runtime's own ``state_max_bytes``); one that is not JSON; NaN or
infinite numbers; a ``global_step`` that is not a whole number in [0, ``MAX_COUNT``]; nesting deeper than
Python's recursion; another method's state; and arrays whose data do not match their shape or dtype. A file
without ``kind`` is read as the expected method's: the APO anchor files written before the kinds. What the state
holds, key by key and number by number, is its runtime's to check (``load_state_dict``).
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from typing import Any

import numpy as np
import torch

from recipe_apo.methods.errors import MethodStateError

__all__ = ["MAX_COUNT", "MAX_STATE_BYTES", "StateFileError", "is_count", "read_state", "shown", "unknown_keys",
           "write_state"]

# The largest state file read back, in bytes, unless the runtime names a smaller bound of its own
# (``state_max_bytes``). The largest writer is CoDaPO's kept prompts: a chat and its metadata per kept prompt, a
# few KiB each for the usual math prompts, about 130 KiB for a 32k-token prompt, so some 130 MiB for 1024 kept
# prompts that long; APO's anchors write at most about 30 bytes per history value (3 MiB per data source at the
# largest history, 100000). 256 MiB keeps a margin over both and bounds what a resume reads into memory
# (a file of numbers costs a few times its size once parsed).
MAX_STATE_BYTES = 256 * 2**20
# The largest count a state holds (steps, updates): 2^53 - 1, the largest whole number every JSON reader keeps
# exactly (RFC 7493). No run counts that far: a step a microsecond would take 285 years.
MAX_COUNT = 2**53 - 1
_READ_CHUNK = 2**20

ARRAY = "__array__"
_RESERVED = ("kind", "global_step")
# The dtypes an array may be read back as (by name); anything else is not what this module wrote.
_DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool)}


class StateFileError(MethodStateError):
    """A state file is missing, unreadable or not the expected method's; the message says which, in one line."""


def _encode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise TypeError(f"a tensor of dtype {dtype} has no state file form")
        data = tensor.float() if tensor.dtype == torch.bfloat16 else tensor
        return {ARRAY: dtype, "shape": list(tensor.shape), "data": data.reshape(-1).tolist()}
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return [_encode(v) for v in value.tolist()]
        return _encode(torch.from_numpy(np.ascontiguousarray(value)))
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"a {type(value).__name__} has no state file form (JSON values, tensors and arrays only)")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if ARRAY in value:
            return _array(value)
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _array(value: dict) -> torch.Tensor:
    dtype, shape, data = value.get(ARRAY), value.get("shape"), value.get("data")
    if dtype not in _DTYPES or not isinstance(shape, list) or not isinstance(data, list):
        raise StateFileError(f"an array entry is malformed (dtype {dtype!r})")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise StateFileError(f"an array's shape {shape!r} is not a list of whole numbers")
    if math.prod(shape) != len(data):
        raise StateFileError(f"an array of shape {shape} holds {len(data)} values")
    if not all(isinstance(v, (int, float)) for v in data):  # bool is an int: a bool array's values
        raise StateFileError("an array holds values that are not numbers")
    target = _DTYPES[dtype]
    if target == torch.bool:
        return torch.tensor(data, dtype=torch.bool).reshape(shape)
    if not target.is_floating_point and not all(isinstance(v, int) for v in data):
        raise StateFileError(f"an {dtype} array holds values that are not whole numbers")
    try:
        return torch.tensor(data, dtype=target).reshape(shape)
    except (OverflowError, RuntimeError) as exc:
        raise StateFileError(f"an {dtype} array holds values out of its range ({type(exc).__name__})") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a state holds")


def _finite_float(text: str) -> float:
    """A JSON number as a float, refused when it overflows (1e400 would read as inf)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a number a state holds (beyond a float's range)")
    return value


def write_state(folder: str, name: str, kind: str, step: int, state: dict) -> str:
    """Write ``state`` of method ``kind`` at ``step`` to ``folder/name`` atomically; return the path."""
    clash = [key for key in _RESERVED if key in state]
    if clash:
        raise ValueError(f"a runtime's state may not use the key {clash[0]!r}")
    payload = {"kind": kind, "global_step": int(step), **_encode(state)}
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o644)  # mkstemp's 0600 would differ from verl's other checkpoint files
            json.dump(payload, handle, indent=1, allow_nan=False)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(folder)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _fsync_dir(folder: str) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_state(path: str, kind: str, max_bytes: int = MAX_STATE_BYTES) -> tuple[dict, Any]:
    """(the state, the step the file says) of method ``kind`` in ``path``; ``StateFileError`` in one line when the
    file is missing, not a regular file, larger than ``max_bytes``, unreadable or another method's."""
    data = _read_bytes(path, max_bytes)
    try:
        payload = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, TypeError, RecursionError, OverflowError, UnicodeDecodeError) as exc:
        # RecursionError: deeply nested JSON; OverflowError: numbers too large for what they stand for;
        # ValueError: also a whole number of more digits than Python converts (sys.get_int_max_str_digits).
        raise StateFileError(f"it cannot be read ({_cause(exc)})") from None
    if not isinstance(payload, dict):
        raise StateFileError(f"it cannot be read (a JSON {type(payload).__name__}, not a mapping)")
    found = payload.get("kind", kind)
    if found != kind:
        raise StateFileError(f"it is not {kind}'s state (kind {found!r})")
    step = payload.get("global_step")
    if step is not None and not is_count(step):
        raise StateFileError(f"it cannot be read (global_step {shown(step)} is not a whole number in "
                             f"[0, {MAX_COUNT}])")
    try:
        state = _decode({key: value for key, value in payload.items() if key not in _RESERVED})
    except RecursionError as exc:
        raise StateFileError(f"it cannot be read ({_cause(exc)})") from None
    except StateFileError as exc:
        raise StateFileError(f"it cannot be read ({exc})") from None
    return state, step


def is_count(value: Any) -> bool:
    """A whole number in [0, ``MAX_COUNT``] (JSON's true and false, and 2.0, are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def shown(value: Any, limit: int = 40) -> str:
    """A value as a message shows it, cut to ``limit`` characters (a number of 4000 digits stays one short line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def unknown_keys(state: dict, known: Any, limit: int = 5) -> str:
    """The keys of ``state`` not among ``known`` as a message lists them (up to ``limit``, each cut short, and how
    many more: a hostile file's message stays one short line); "" when there are none."""
    keys = sorted(str(key) for key in state if key not in known)
    text = ", ".join(shown(key) for key in keys[:limit])
    return text + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(path: str, mode: int) -> StateFileError:
    what = next((name for test, name in _KINDS if test(mode)), "not a file")
    if os.path.islink(path):
        what = f"a link to {os.path.realpath(path)}, {what}"
    return StateFileError(f"it is not a regular file ({what})")


def _too_large(size: int, max_bytes: int) -> StateFileError:
    return StateFileError(f"it holds {size} bytes, more than the {max_bytes} a state file of this method may hold "
                          "(the recipe writes far less)")


def _read_bytes(path: str, max_bytes: int) -> bytes:
    """The file's bytes, read only when it is a regular file (links followed) of at most ``max_bytes``.

    ``stat`` first: opening a FIFO for reading blocks until a writer comes, and some devices act when opened. The
    open is non-blocking all the same, and what was opened is examined again (``fstat``): the path may have been
    replaced in between. The read stops one byte past the bound (a file that grew meanwhile)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise StateFileError(f"it is missing (a link to {os.readlink(path)}, which does not exist)") from None
        raise StateFileError("it is missing") from None
    except (OSError, ValueError) as exc:  # ValueError: a path holding a NUL byte
        raise StateFileError(f"it cannot be read ({_cause(exc)})") from None
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode)
    if info.st_size > max_bytes:
        raise _too_large(info.st_size, max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise StateFileError(f"it cannot be read ({_cause(exc)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path, info.st_mode)
        if info.st_size > max_bytes:
            raise _too_large(info.st_size, max_bytes)
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise StateFileError(f"it cannot be read ({_cause(exc)})") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise _too_large(size, max_bytes)
    return b"".join(chunks)


def _cause(exc: BaseException) -> str:
    """``Type: message`` on one line (a parser's message may span several)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
