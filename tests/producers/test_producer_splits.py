"""Held-out splits of the file sources (test files, or a share of the rows by a hash of the
prompt), the arithmetic split through the same API, and GSM8K-style answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonl_files import write_jsonl

from astraflow.producers import SourceError, held_out_specs, split_specs, task_name, tasks
from astraflow.producers.arithmetic import arithmetic
from astraflow.producers.config import ProducerConfig


def prompts(specs: Any) -> list[str]:
    return [s.prompt[-1].content for s in specs]


def test_jsonl_with_held_out_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": str(i)}
                                           for i in range(20)])
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": f"q{i}", "answer": str(i)}
                                          for i in (3, 50, 51)])
    pc = ProducerConfig(source="jsonl", path=["{out}/train.jsonl"],
                        test_path=["{out}/test.jsonl"])
    train = list(split_specs(pc, "train", tmp_path))
    test = held_out_specs(pc, 10, tmp_path)
    assert prompts(test) == ["q3", "q50", "q51"]
    # a training row whose prompt is held out is left out of training
    assert prompts(train) == [f"q{i}" for i in range(20) if i != 3]
    assert [t.id for t in tasks(pc, tmp_path)] == [s.id for s in train]
    assert task_name(pc) == "train"


def test_jsonl_with_a_held_out_fraction(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "qa.jsonl", [{"prompt": f"question {i}", "answer": str(i)}
                                        for i in range(400)]
                + [{"id": "dup", "prompt": "question 7", "answer": "7"}])
    pc = ProducerConfig(source="jsonl", path=[str(tmp_path / "qa.jsonl")], test_fraction=0.25)
    train, test = list(split_specs(pc, "train")), list(split_specs(pc, "test"))
    assert len(set(prompts(train)) | set(prompts(test))) == 400
    assert len(prompts(test)) == len(set(prompts(test)))  # a held-out question counts once
    # the repeated row trains twice or is held out once
    assert len(train) + len(test) == (400 if "question 7" in prompts(test) else 401)
    assert 60 < len(test) < 140  # ~100
    assert not set(prompts(train)) & set(prompts(test))  # the repeated question too
    assert prompts(held_out_specs(pc, 5)) == prompts(test[:5])
    # the split is a function of the prompt: the same rows in another order split the same
    rows = [json.loads(line) for line in (tmp_path / "qa.jsonl").read_text().splitlines()]
    write_jsonl(tmp_path / "shuffled.jsonl", rows[::-1])
    flipped = pc.model_copy(update={"path": [str(tmp_path / "shuffled.jsonl")]})
    assert sorted(prompts(split_specs(flipped, "test"))) == sorted(prompts(test))
    # 0 (the default): every row trains, and there is no held-out split
    everything = pc.model_copy(update={"test_fraction": 0.0})
    assert len(list(split_specs(everything, "train"))) == 401
    with pytest.raises(SourceError, match=r"producer.source='jsonl' has no held-out split: set "
                                          r"producer\.test_path .* or producer\.test_fraction"):
        held_out_specs(everything, 10)


def test_parquet_with_a_held_out_fraction(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": [f"{i}+1=" for i in range(300)],
                             "answer": [str(i + 1) for i in range(300)]}), tmp_path / "a.parquet")
    pc = ProducerConfig(source="parquet", path=[str(tmp_path / "a.parquet")], test_fraction=0.1)
    train, test = list(split_specs(pc, "train")), list(split_specs(pc, "test"))
    assert len(train) + len(test) == 300 and test
    assert not set(prompts(train)) & set(prompts(test))


def test_arithmetic_through_the_split_api_is_the_old_held_out_split() -> None:
    pc = ProducerConfig(arithmetic={"count": 30, "test_fraction": 0.1})
    cfg = pc.arithmetic.model_copy(update={"split": "test", "count": None})
    old = [spec for spec, _ in arithmetic(cfg)]
    assert [s.id for s in split_specs(pc, "test")] == [s.id for s in old]
    assert [s.id for s in held_out_specs(pc, 7)] == [s.id for s in old[:7]]
    assert [s.id for s in split_specs(pc, "train")] == [t.id for t in tasks(pc)]
    assert len(list(split_specs(pc, "train"))) == 30
    with pytest.raises(SourceError, match=r"producer\.arithmetic\.test_fraction"):
        held_out_specs(pc.model_copy(update={"arithmetic": pc.arithmetic.model_copy(
            update={"test_fraction": 0.0})}), 5)
    with pytest.raises(SourceError, match="unknown split 'dev'; valid: train, test"):
        list(split_specs(pc, "dev"))  # type: ignore[arg-type]


def test_answer_regex_takes_the_final_answer(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "gsm.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?",
         "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "What is 6 * 7?", "answer": "6 * 7 = 42\n####  42"},
    ])
    pc = ProducerConfig.model_validate({
        "source": "jsonl", "path": [str(tmp_path / "gsm.jsonl")],
        "fields": {"prompt": "question", "answer_regex": r"####\s*(.+)$"}})
    assert [s.reference for s in split_specs(pc, "train")] == [{"answer": "7"}, {"answer": "42"}]
    write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "no marker"}])
    bad = pc.model_copy(update={"path": [str(tmp_path / "bad.jsonl")]})
    with pytest.raises(SourceError, match=r"bad.jsonl:1: producer\.fields\.answer_regex "
                                          r"'####\\\\s\*\(\.\+\)\$' does not match"):
        list(split_specs(bad, "train"))


def test_bad_answer_regex_is_refused_at_load() -> None:
    from astraflow.config import ExperimentConfig
    from astraflow.core.config import validate
    from astraflow.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"producer\.fields\.answer_regex: .*not a valid "
                                          r"regular expression"):
        validate(ExperimentConfig, {"producer": {"fields": {"answer_regex": "(unclosed"}}})


def test_a_held_out_question_repeated_in_its_file_counts_once(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}", "answer": str(i)}
                                           for i in range(5)])
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "h1", "answer": "1"},
                                          {"prompt": "h2", "answer": "2"},
                                          {"id": "again", "prompt": "h1", "answer": "1"}])
    pc = ProducerConfig(source="jsonl", path=[str(tmp_path / "train.jsonl")],
                        test_path=[str(tmp_path / "test.jsonl")])
    assert prompts(held_out_specs(pc, 10)) == ["h1", "h2"]
