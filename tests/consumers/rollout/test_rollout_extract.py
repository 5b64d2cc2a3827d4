"""Answer extraction (``rollout.reward.extract``): each extractor, through the reward the
evaluator builds and through the worker's runtime, where the trajectory keeps the whole
completion and only the reward sees the answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from astraflow.consumers.rollout.config import RewardConfig
from astraflow.consumers.rollout.rewards import EXTRACTORS, build_reward, inline, score
from astraflow.consumers.rollout.rewards.extract import with_extract
from astraflow.consumers.rollout.runtime import Runtime, run_episode
from astraflow.core.errors import ConfigError
from astraflow.core.records import ChatMessage, Task

CASES = [  # extractor, completion, what it extracts
    ("none", " 42 ", " 42 "),
    ("last_number", "3 apples and 4 pears: 1,234.5 in all.", "1234.5"),
    ("last_number", "the answer is -7.", "-7"),
    ("last_number", "no digits", ""),
    ("first_word", "Yes. Because all men are mortal.", "Yes"),
    ("first_word", "  **No**, never", "No"),
    ("first_word", "-5, since", "-5"),
    ("first_line", "\n  Paris  \nis the capital", "Paris"),
    ("last_line", "working...\n\n  So: 12 \n\n", "So: 12"),
    ("answer_tag", "<answer>1</answer> no, <answer> 2 </answer>", "2"),
    ("answer_tag", "think <answer>open to the end", "open to the end"),
    ("answer_tag", "no tag", ""),
    ("boxed", r"so \boxed{1} then \boxed{\frac{1}{2}} done", r"\frac{1}{2}"),
    ("boxed", r"\boxed{never closed", ""),
]


@pytest.mark.parametrize(("name", "completion", "want"), CASES)
def test_extractors(name: str, completion: str, want: str) -> None:
    assert EXTRACTORS.resolve(name)(completion) == want


@pytest.mark.parametrize(("name", "completion", "want"),
                         [c for c in CASES if c[0] != "none" and c[2]])
def test_each_extractor_through_the_reward(name: str, completion: str, want: str) -> None:
    reference = {"answer": want}
    assert build_reward(RewardConfig(name="exact_match", extract=name))(completion,
                                                                        reference) == 1.0
    assert build_reward(RewardConfig(name="exact_match"))(completion, reference) == 0.0


def upper(text: str) -> str:
    return text.strip().upper()


def test_a_user_extractor_and_bad_names() -> None:
    reward = build_reward(RewardConfig(name="exact_match", extract="test_rollout_extract:upper"))
    assert reward(" paris ", {"answer": "PARIS"}) == 1.0
    with pytest.raises(ValueError, match="unknown answer extractor 'boxd'; valid: answer_tag, "
                                         "boxed, first_line, first_word, last_line, "
                                         "last_number, none, or 'module.path:function'"):
        RewardConfig(extract="boxd")
    from astraflow.config import ExperimentConfig
    from astraflow.core.config import validate

    with pytest.raises(ConfigError, match=r"rollout\.reward\.extract: .*unknown answer "
                                          r"extractor 'Boxed'"):
        validate(ExperimentConfig, {"rollout": {"reward": {"extract": "Boxed"}}})


def test_the_wrapper_keeps_sync_async_and_inline() -> None:
    @inline
    def exact(completion: str, reference: dict[str, Any]) -> float:
        return float(completion == reference["answer"])

    async def later(completion: str, reference: dict[str, Any]) -> float:
        return float(completion == reference["answer"])

    wrapped = with_extract(exact, "answer_tag")
    assert wrapped.af_inline and wrapped.__name__ == "exact"  # type: ignore[attr-defined]
    assert with_extract(exact, "none") is exact
    ref = {"answer": "4"}
    for fn in (wrapped, with_extract(later, "answer_tag")):
        assert asyncio.run(score(fn, "2+2 <answer>4</answer>", ref)).value == 1.0


def test_the_runtime_scores_the_extracted_answer_and_keeps_the_completion(
        ascii_tokenizer: Any, rule_engine: Any) -> None:
    completion = "2 and 2 make <answer>4</answer>"
    task = Task(id="t", dataset="t", prompt=[ChatMessage(role="user", content="2+2?")],
                reference={"answer": "4"}, n_samples=1)

    def run(extract: str) -> Any:
        rt = Runtime.create({"default": rule_engine(ascii_tokenizer, lambda _p: completion)},
                            reward="exact_match", extract=extract,
                            sampling={"max_new_tokens": 64})

        async def go() -> Any:
            try:
                return await run_episode(rt, task, 0)
            finally:
                await rt.close()

        return asyncio.run(asyncio.wait_for(go(), 30))

    tagged, whole = run("answer_tag"), run("none")
    assert tagged.error is None and tagged.drafts[0].reward == 1.0
    assert whole.drafts[0].reward == 0.0
    draft = tagged.drafts[0]
    trained = ascii_tokenizer.decode(draft.token_ids[draft.prompt_len:],
                                     skip_special_tokens=True)
    assert trained == completion  # what is trained on is the whole completion


def test_a_users_extractor_takes_an_inline_reward_off_the_event_loop() -> None:
    """A registered extractor is cheap, so an inline reward stays inline; a user's may be
    slow, so the reward then runs in a thread under its timeout."""
    from astraflow.consumers.rollout.rewards.basic import exact_match
    from astraflow.consumers.rollout.rewards.extract import with_extract

    assert with_extract(exact_match, "last_number").af_inline is True
    assert with_extract(exact_match, lambda text: text).af_inline is False
    assert exact_match.af_inline is True  # the registered reward itself is left as it was
