"""Hugging Face ``datasets`` from local disk: a folder written by save_to_disk (one split, or a
DatasetDict with its test split), GSM8K-shaped data files mapped through producer.fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from astraflow.producers import SourceError, held_out_specs, split_specs, task_name, tasks
from astraflow.producers.config import ProducerConfig

datasets = pytest.importorskip("datasets")

GSM8K_FIELDS = {"prompt": "question", "answer_regex": r"####\s*(.+)$"}


def hf(tmp_path: Path, **section: Any) -> ProducerConfig:
    extra = section.pop("producer", {})
    return ProducerConfig.model_validate({
        "source": "hf_datasets", **extra,
        "hf_datasets": {"cache_dir": str(tmp_path / "hf-cache"), **section}})


def gsm_rows(start: int, n: int) -> list[dict[str, str]]:
    return [{"question": f"Sam has {i} apples and gets 2 more. How many now?",
             "answer": f"{i} + 2 = <<{i}+2={i + 2}>>{i + 2}\n#### {i + 2}"}
            for i in range(start, start + n)]


def test_a_saved_dataset_dict_with_its_test_split(tmp_path: Path) -> None:
    train_rows, test_rows = gsm_rows(0, 30), gsm_rows(100, 5)
    datasets.DatasetDict({
        "train": datasets.Dataset.from_list(train_rows + test_rows[:1]),  # one leaked row
        "test": datasets.Dataset.from_list(test_rows)}).save_to_disk(str(tmp_path / "gsm8k"))
    pc = hf(tmp_path, path="{out}/gsm8k", producer={"fields": GSM8K_FIELDS})
    train = list(split_specs(pc, "train", tmp_path))
    test = held_out_specs(pc, 100, tmp_path)
    assert len(train) == 30 and len(test) == 5  # the leaked row is not trained on
    assert test[0].prompt[0].content == test_rows[0]["question"]
    assert test[0].reference == {"answer": "102"} and train[3].reference == {"answer": "5"}
    assert train[0].id == "gsm8k/train:0" and test[0].id == "gsm8k/test:0"
    got = list(tasks(pc, tmp_path))
    assert len(got) == 30 and got[0].dataset == task_name(pc) == "gsm8k"


def test_a_saved_single_dataset_needs_a_fraction_for_held_out(tmp_path: Path) -> None:
    rows = [{"prompt": f"say {i}", "answer": str(i)} for i in range(200)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "say"))
    pc = hf(tmp_path, path=str(tmp_path / "say"))
    assert len(list(split_specs(pc, "train"))) == 200
    with pytest.raises(SourceError, match=r"producer\.hf_datasets\.test_split: the dataset has no "
                                          r"split 'test' \(it has: train\) and "
                                          r"producer\.test_fraction is 0"):
        held_out_specs(pc, 10)
    pc = pc.model_copy(update={"test_fraction": 0.2})
    train, test = list(split_specs(pc, "train")), list(split_specs(pc, "test"))
    assert len(train) + len(test) == 200 and 15 < len(test) < 70
    assert not {s.prompt[0].content for s in train} & {s.prompt[0].content for s in test}


def test_gsm8k_shaped_json_files(tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    for name, rows in (("train", gsm_rows(0, 12)), ("test", gsm_rows(50, 4))):
        (tmp_path / "gsm8k" / f"{name}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    pc = hf(tmp_path, data_files={"train": "{out}/gsm8k/train.jsonl",
                                  "test": "{out}/gsm8k/test.jsonl"},
            producer={"fields": GSM8K_FIELDS})
    train = list(split_specs(pc, "train", tmp_path))
    test = list(split_specs(pc, "test", tmp_path))
    assert [s.reference["answer"] for s in train] == [str(i + 2) for i in range(12)]
    assert [s.reference["answer"] for s in test] == [str(i + 2) for i in range(50, 54)]
    assert task_name(pc) == "gsm8k"  # the folder of files named by split
    assert train[0].id == "gsm8k/train:0"
    # one file: it is `split`; the held-out share comes from producer.test_fraction
    one = hf(tmp_path, path=str(tmp_path / "gsm8k" / "train.jsonl"),
             producer={"fields": GSM8K_FIELDS, "test_fraction": 0.5})
    assert len(list(split_specs(one, "train"))) + len(list(split_specs(one, "test"))) == 12


def test_missing_sources_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"producer\.hf_datasets\.path: .*nope does not exist"):
        list(split_specs(hf(tmp_path, path=str(tmp_path / "nope")), "train"))
    with pytest.raises(SourceError, match=r"needs producer\.hf_datasets\.path"):
        list(split_specs(hf(tmp_path), "train"))
    with pytest.raises(SourceError, match=r"producer\.hf_datasets\.data_files: data file .*"
                                          r"gone\.jsonl does not exist"):
        list(split_specs(hf(tmp_path, data_files=[str(tmp_path / "gone.jsonl")]), "train"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(SourceError, match=r"producer\.hf_datasets\.path: .*plain is not a saved "
                                          r"dataset"):
        list(split_specs(hf(tmp_path, path=str(tmp_path / "plain")), "train"))
    (tmp_path / "d.txt").write_text("x\n")
    with pytest.raises(SourceError, match=r"producer\.hf_datasets\.format: cannot tell"):
        list(split_specs(hf(tmp_path, path=str(tmp_path / "d.txt")), "train"))
    datasets.DatasetDict({"validation": datasets.Dataset.from_list([{"prompt": "p"}])}
                         ).save_to_disk(str(tmp_path / "val"))
    with pytest.raises(SourceError, match=r"producer\.hf_datasets\.split: the dataset has no "
                                          r"split 'train'; it has: validation"):
        list(split_specs(hf(tmp_path, path=str(tmp_path / "val")), "train"))
