"""reasoning-gym task suites: seeded items, train and held-out splits that share no question,
references that survive msgpack and JSON, scored by the dataset's own scorer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from astraflow.consumers.rollout.config import RewardConfig
from astraflow.consumers.rollout.rewards import build_reward, score
from astraflow.core.errors import ConfigError
from astraflow.core.records import Task, decode, encode
from astraflow.producers import SourceError, held_out_specs, split_specs, task_name, tasks
from astraflow.producers.config import ProducerConfig
from astraflow.producers.reasoning_gym import plain

pytest.importorskip("reasoning_gym")


def rg(**section: Any) -> ProducerConfig:
    return ProducerConfig.model_validate({"source": "reasoning_gym", "reasoning_gym": section})


def questions(specs: list) -> list[str]:
    return [s.prompt[-1].content for s in specs]


def test_items_are_seeded_and_the_splits_share_no_question() -> None:
    pc = rg(dataset="basic_arithmetic", config={"min_terms": 2, "max_terms": 2}, size=500,
            test_size=200)
    train, test = list(split_specs(pc, "train")), list(split_specs(pc, "test"))
    assert len(train) == 500 and len(test) == 200
    again = list(split_specs(pc, "train"))
    assert [(s.id, s.prompt, s.reference) for s in again] == [
        (s.id, s.prompt, s.reference) for s in train]
    assert not set(questions(train)) & set(questions(test))
    assert len(set(questions(test))) == 200  # the held-out split keeps each question once
    assert all(s.id.startswith("rg/basic_arithmetic/") for s in train)
    assert {s.metadata["split"] for s in train} == {"train"}
    assert {s.metadata["split"] for s in test} == {"test"}
    other = list(split_specs(rg(dataset="basic_arithmetic", size=50, seed=7), "train"))
    assert questions(other) != questions(train)[:50]
    # the producer releases the train split, named after the dataset
    released = list(tasks(pc))
    assert [t.id for t in released] == [s.id for s in train]
    assert released[0].dataset == task_name(pc) == "rg/basic_arithmetic"
    assert [s.id for s in held_out_specs(pc, 20)] == [s.id for s in test[:20]]


def test_a_tiny_question_space_still_splits_by_question() -> None:
    """Both seeds draw from the same ~400 questions: only the hash keeps the splits apart."""
    cfg = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
           "operators": ["+"]}
    pc = rg(dataset="basic_arithmetic", config=cfg, size=600, test_size=40, test_fraction=0.3)
    train, test = questions(split_specs(pc, "train")), questions(split_specs(pc, "test"))
    assert len(set(train)) < len(train)  # the space is small enough to repeat questions
    assert len(test) == 40 and not set(train) & set(test)


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "syllogism", "chain_sum"])
def test_the_reward_scores_the_reference_answer_right_and_a_wrong_one_zero(dataset: str) -> None:
    pc = rg(dataset=dataset, size=6, test_size=6)
    reward = build_reward(RewardConfig(name="reasoning_gym"))
    specs = list(split_specs(pc, "train")) + list(split_specs(pc, "test"))
    for spec in specs:
        ref = through_the_bus(spec).reference
        answer = ref["answer"]
        assert reward(answer, ref) == 1.0, (spec.prompt, answer)
        assert reward(wrong(answer), ref) == 0.0, (spec.prompt, answer)
    # the answer in a tag, for a prompt that asks for one
    tagged = build_reward(RewardConfig(name="reasoning_gym", extract="answer_tag"))
    ref = specs[0].reference
    assert tagged(f"Let me think.\n<answer>{ref['answer']}</answer>", ref) == 1.0
    assert tagged(ref["answer"], ref) == 0.0  # no tag, no answer


def wrong(answer: str) -> str:
    if answer in ("Yes", "No"):
        return "No" if answer == "Yes" else "Yes"
    try:
        return str(int(answer) + 1)
    except ValueError:
        return f"not {answer}"


def through_the_bus(spec: Any) -> Task:
    task = Task(id=spec.id, dataset="rg", prompt=spec.prompt, reference=spec.reference)
    got = decode(encode(task), Task)
    assert got == task
    return got  # type: ignore[return-value]


@pytest.mark.parametrize("dataset", ["arc_agi", "knights_knaves", "advanced_geometry",
                                     "graph_color", "course_schedule", "futoshiki"])
def test_rich_metadata_survives_msgpack_and_json(dataset: str) -> None:
    """Tuples, int keys and nested grids in an item's metadata: the reference is plain data
    that msgpack and JSON carry unchanged, and the reward still scores with the original item
    (ARC compares tuple grids)."""
    (spec,) = split_specs(rg(dataset=dataset, size=1, test_size=1), "train")
    task = through_the_bus(spec)
    assert json.loads(json.dumps(task.reference)) == task.reference
    entry = task.reference["rg_entry"]
    assert set(entry) >= {"question", "answer", "metadata"}
    if task.reference.get("answer") is not None:
        reward = build_reward(RewardConfig(name="reasoning_gym"))
        assert reward(task.reference["answer"], task.reference) == 1.0


def test_plain_coerces_what_json_and_msgpack_cannot_hold() -> None:
    np = pytest.importorskip("numpy")
    value = {1: (2, 3), "s": {3, 1}, "n": np.int64(4), "f": np.float32(0.5),
             "a": np.arange(3), "big": 2**70, "o": object}
    got = plain(value)
    assert got == {"1": [2, 3], "s": [1, 3], "n": 4, "f": 0.5, "a": [0, 1, 2],
                   "big": str(2**70), "o": str(object)}
    assert json.loads(json.dumps(got)) == got


def test_a_reference_without_rg_dataset_is_a_clear_error() -> None:
    import asyncio

    from astraflow.consumers.rollout.rewards import REWARDS

    fn = REWARDS.resolve("reasoning_gym")
    with pytest.raises(ValueError, match="needs the reference's 'rg_dataset'"):
        fn("42", {"answer": "42"})
    res = asyncio.run(score(fn, "42", {"answer": "42"}))
    assert res.failed and "rg_dataset" in (res.error or "")


def test_bad_dataset_names_and_configs_name_the_key() -> None:
    with pytest.raises(SourceError, match=r"unknown reasoning-gym dataset 'basic_arithmetik' in "
                                          r"producer\.reasoning_gym\.dataset; did you mean "
                                          r"basic_arithmetic.*valid \(\d+\): ab, acre"):
        list(split_specs(rg(dataset="basic_arithmetik"), "train"))
    with pytest.raises(SourceError, match=r"producer\.reasoning_gym\.config .* refused by dataset "
                                          r"'chain_sum'.*config fields: .*max_terms"):
        list(split_specs(rg(dataset="chain_sum", config={"max_termz": 3}), "test"))
    with pytest.raises(SourceError, match=r"producer\.reasoning_gym\.config"):
        list(split_specs(rg(dataset="chain_sum", config={"min_terms": 5, "max_terms": 2}),
                         "train"))


def test_equal_seeds_and_seeds_in_config_are_refused_at_load() -> None:
    from astraflow.config import ExperimentConfig
    from astraflow.core.config import validate

    with pytest.raises(ConfigError, match=r"producer\.reasoning_gym\.test_seed \(3\) equals "
                                          r"seed"):
        validate(ExperimentConfig, {"producer": {"source": "reasoning_gym", "reasoning_gym": {
            "seed": 3, "test_seed": 3}}})
    with pytest.raises(ConfigError, match=r"producer\.reasoning_gym\.config: .*seed cannot be "
                                          r"set in config"):
        validate(ExperimentConfig, {"producer": {"reasoning_gym": {"config": {"seed": 1}}}})
