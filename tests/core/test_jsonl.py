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


def test_a_json_line_never_holds_nan_or_infinity() -> None:
    """A NaN loss or an infinite reward is written as null: strict JSON, readable by any
    parser (Python's json.dumps would write the non-JSON tokens NaN and Infinity)."""
    import json
    import math

    from astraflow.core.jsonl import json_line

    line = json_line({"loss": math.nan, "r": [1.0, math.inf, {"x": -math.inf}], "ok": 2.5,
                      "t": (math.nan,), "s": "NaN"})
    assert "NaN" not in line.replace('"NaN"', "") and "Infinity" not in line
    assert json.loads(line) == {"loss": None, "r": [1.0, None, {"x": None}], "ok": 2.5,
                                "t": [None], "s": "NaN"}
