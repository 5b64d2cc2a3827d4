"""Writing a JSONL file in a test, one way:

    from jsonl_files import write_jsonl
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": 2}, ""])
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: Iterable[Any]) -> Path:
    """Write ``rows`` to ``path``, one JSON document a line, and return ``path``; a row that
    is a string is written as it is (a blank or broken line, for a reader to skip or refuse)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
