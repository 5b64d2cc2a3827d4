"""Dataset readers: JSONL and Parquet rows become tasks; bad rows are named by file and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonl_files import write_jsonl

from astraflow.producers.config import FieldMap
from astraflow.producers.sources import SourceError, read_jsonl, read_parquet


def test_jsonl_rows_map_to_tasks(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "math.jsonl", [
        {"id": "a1", "prompt": "2+2=", "answer": 4},
        "",
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "hi"}], "reference": {"answer": "x"}},
        {"prompt": "code it", "tests": ["assert f() == 1"], "extra": 1},
    ])
    specs = list(read_jsonl(path, dataset="math", fields=FieldMap()))
    assert [s.id for s in specs] == ["a1", "math:1", "math:2"]
    assert specs[0].prompt[0].role == "user" and specs[0].prompt[0].content == "2+2="
    assert specs[0].reference == {"answer": 4}
    assert [m.role for m in specs[1].prompt] == ["system", "user"]
    assert specs[1].reference == {"answer": "x"}
    assert specs[2].reference == {"tests": ["assert f() == 1"]}


def test_field_names_are_configurable(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "1+1=", "a": "2", "uid": 7}])
    fields = FieldMap(prompt="q", id="uid", reference_fields=["a"])
    (spec,) = read_jsonl(path, dataset="d", fields=fields)
    assert (spec.id, spec.prompt[0].content, spec.reference) == ("7", "1+1=", {"a": "2"})


@pytest.mark.parametrize(("row", "message"), [
    ("{not json", "d.jsonl:2: not valid JSON"),
    ({"text": "no prompt"}, "d.jsonl:2: no prompt: expected a 'prompt' string or a 'messages'"),
    ({"messages": [{"role": "user"}]}, "d.jsonl:2: messages[0] must be an object"),
    ({"prompt": "x", "reference": [1]}, "d.jsonl:2: 'reference' must be an object"),
    ([1, 2], "d.jsonl:2: expected an object, got list"),
])
def test_bad_rows_name_the_file_and_line(tmp_path: Path, row: object, message: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok"}, row])
    with pytest.raises(SourceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        list(read_jsonl(path, dataset="d", fields=FieldMap()))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="cannot open dataset"):
        list(read_jsonl(tmp_path / "nope.jsonl", dataset="d", fields=FieldMap()))


def test_parquet_rows_map_to_tasks(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"prompt": [f"{i}+1=" for i in range(2500)],
                      "answer": [str(i + 1) for i in range(2500)]})
    pq.write_table(table, tmp_path / "arith.parquet", row_group_size=1000)
    specs = list(read_parquet(tmp_path / "arith.parquet", dataset="arith", fields=FieldMap()))
    assert len(specs) == 2500
    assert specs[1234].id == "arith:1234" and specs[1234].reference == {"answer": "1235"}
    bad = pa.table({"question": ["x"]})
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(SourceError, match=r"bad.parquet row 0: no prompt"):
        list(read_parquet(tmp_path / "bad.parquet", dataset="b", fields=FieldMap()))
