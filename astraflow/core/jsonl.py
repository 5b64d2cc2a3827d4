"""Reading a JSON-lines log that a process appends to (a trainer's ``trainer-<policy>.jsonl``,
``metrics.jsonl``): its rows, less a last line cut short by a SIGKILL."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def log_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The object rows of the JSON-lines file ``path`` (none when it is not there); a line
    that is not JSON (cut by a SIGKILL mid-write) or not an object is skipped."""
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            yield row


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, ±Infinity) replaced by None, in
    nested dicts, lists and tuples: what a JSON line may hold (``NaN`` is no JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def json_line(row: Any) -> str:
    """One JSON line of ``row`` (no newline): strict JSON, a non-finite float written as
    ``null`` (a NaN loss or an infinite reward must not make the file unreadable to any
    parser but Python's)."""
    return json.dumps(finite(row), allow_nan=False)
