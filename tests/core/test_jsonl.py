"""astraflow.core.jsonl: a JSON-lines log's rows, less a line cut by a SIGKILL."""

from __future__ import annotations

from pathlib import Path

from astraflow.core.jsonl import log_rows


def test_rows_skip_a_cut_line_and_non_objects(tmp_path: Path) -> None:
    path = tmp_path / "trainer-default.jsonl"
    path.write_text('{"step": 1}\n[1, 2]\n\n{"step": 2, "batch_id": "b"}\n{"step": 3, "ba')
    assert list(log_rows(path)) == [{"step": 1}, {"step": 2, "batch_id": "b"}]


def test_a_missing_log_has_no_rows(tmp_path: Path) -> None:
    assert list(log_rows(tmp_path / "nope.jsonl")) == []
