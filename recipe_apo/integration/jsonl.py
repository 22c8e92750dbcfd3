"""Reading JSON-lines files (verl's dumps, the recipe's score files) with errors that name file and line."""

from __future__ import annotations

import json
from typing import Iterator, Sequence


def read_rows(path, required: Sequence[str], hint: str,
              error: type[ValueError] = ValueError) -> Iterator[tuple[int, dict]]:
    """``(line number, row)`` for every non-blank line; ``error`` names ``path:line`` for a line that is not
    JSON or lacks a ``required`` key (``hint`` says what the file should be)."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise error(f"{path}:{number}: not JSON ({exc})") from None
            missing = [key for key in required if not isinstance(row, dict) or key not in row]
            if missing:
                raise error(f"{path}:{number}: no {' or '.join(missing)} field ({hint})")
            yield number, row
