"""Reading JSON-lines files (verl's dumps, the recipe's score files) with errors that name file and line.

The files are treated as untrusted: whatever is in them (a folder named like one, a byte that is not UTF-8, a
last line a crashed writer cut short, nesting too deep for the parser) ends in one ``error`` naming the file
and, where there is one, the line.
"""

from __future__ import annotations

import json
from typing import Iterator, Sequence


def read_rows(path, required: Sequence[str], hint: str,
              error: type[Exception] = ValueError) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` for every non-blank line; ``error`` names ``path`` for a file that cannot be read
    and ``path:line`` for a line that is not UTF-8, not a JSON object, or lacks a ``required`` key (``hint``
    says what the file should be)."""
    try:
        handle = open(path, "rb")  # bytes: a bad byte is then named by its line, not by an offset in a buffer
    except IsADirectoryError:
        raise error(f"{path}: a folder, not a file") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with handle:
        try:
            for number, raw in enumerate(handle, 1):
                row = _row(path, number, raw, required, hint, error)
                if row is not None:  # a blank line
                    yield number, row
        except OSError as exc:  # the read itself failed (an I/O error, a file removed under a network mount)
            raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def _row(path, number: int, raw: bytes, required: Sequence[str], hint: str, error: type[Exception]):
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}:{number}: not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1})") \
            from None
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        if not raw.endswith(b"\n"):
            raise error(f"{path}:{number}: the last line is cut short (not JSON and no newline at its end: "
                        "a writer that stopped mid-line?)") from None
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise error(f"{path}:{number}: not JSON ({reason})") from None
    if not isinstance(row, dict):
        raise error(f"{path}:{number}: a JSON {_JSON_KINDS.get(type(row), 'value')}, not an object ({hint})")
    missing = [key for key in required if key not in row]
    if missing:
        raise error(f"{path}:{number}: no {' or '.join(missing)} field ({hint})")
    return row
