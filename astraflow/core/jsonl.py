"""Reading a JSON-lines log that a process appends to (a trainer's ``trainer-<policy>.jsonl``,
``metrics.jsonl``): its rows, less a last line cut short by a SIGKILL."""

from __future__ import annotations

import json
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
