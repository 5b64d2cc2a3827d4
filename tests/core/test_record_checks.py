"""The values of a trajectory checked at a role's door (astraflow.core.records.checks): each
kind of untrustworthy value is refused with its reason, an honest record passes unchanged,
and ``beyond_bound: clip`` clips."""

from __future__ import annotations

import math

import msgspec
import pytest

from astraflow.core.errors import SchemaError
from astraflow.core.records import Trajectory, TurnSpan, pack_f32, pack_i32, pack_u8
from astraflow.core.records.checks import RecordLimits, checked, trajectory_problem

LIMITS = RecordLimits(vocab={"default": 50}, reward_bound=100.0)


def honest(**changes: object) -> Trajectory:
    t = Trajectory(id="t", task_id="k", group_id="g", token_ids=pack_i32([1, 5, 7, 49]),
                   loss_mask=pack_u8([0, 0, 1, 1]), logprobs=pack_f32([0, 0, -0.5, -2.0]),
                   versions=pack_i32([-1, -1, 3, 3]), prompt_len=2, reward=1.0,
                   spans=[TurnSpan(start=0, end=2, role="prompt"),
                          TurnSpan(start=2, end=4, role="assistant")])
    return msgspec.structs.replace(t, **changes)


def test_an_honest_trajectory_passes_unchanged() -> None:
    t = honest()
    assert trajectory_problem(t, LIMITS) is None
    assert checked(t, LIMITS) is t and t.reward == 1.0


@pytest.mark.parametrize(("changes", "reason"), [
    ({"token_ids": pack_i32([1, 5, 7, 999999])}, "token id 999999 is outside"),
    ({"token_ids": pack_i32([1, 5, 7, 50])}, "(ids 0..49)"),
    ({"token_ids": pack_i32([1, -3, 7, 4])}, "token id -3 is negative"),
    ({"loss_mask": pack_u8([0, 0, 2, 1])}, "loss_mask holds 2"),
    ({"logprobs": pack_f32([0, 0, math.nan, -1.0])}, "logprob is not finite"),
    ({"logprobs": pack_f32([0, 0, -math.inf, -1.0])}, "logprob is not finite"),
    ({"logprobs": pack_f32([0, 0, 3.0, -1.0])}, "logprob is 3 > 0"),
    ({"versions": pack_i32([-7, -1, 3, 3])}, "version is -7, below -1"),
    ({"prompt_len": 9}, "prompt_len 9 is outside"),
    ({"spans": [TurnSpan(start=2, end=40, role="assistant")]}, "turn span [2, 40)"),
    ({"reward": math.nan}, "reward is nan: rewards must be finite"),
    ({"reward": math.inf}, "reward is inf"),
    ({"reward": 1e308}, "beyond the reward bound 100"),
    ({"reward": -101.0}, "beyond the reward bound"),
    ({"rewards": {"format": math.nan}}, "rewards['format'] is nan"),
    ({"turn_rewards": [math.inf]}, "turn_rewards[0] is inf"),
    ({"sample_index": -1}, "sample_index -1"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_untrustworthy_value_is_refused_with_its_reason(changes: dict[str, object],
                                                             reason: str) -> None:
    t = honest(**changes)
    problem = trajectory_problem(t, LIMITS)
    assert problem is not None and reason in problem, problem
    with pytest.raises(SchemaError, match="trajectory 't' of policy 'default'"):
        checked(t, LIMITS)


def test_ids_are_checked_against_the_policys_own_vocabulary() -> None:
    big = honest(token_ids=pack_i32([1, 5, 7, 60]))
    assert trajectory_problem(big, LIMITS) is not None
    assert trajectory_problem(msgspec.structs.replace(big, policy="other"), LIMITS) is None


def test_clip_clips_finite_rewards_and_still_refuses_non_finite_ones() -> None:
    clip = RecordLimits(reward_bound=10.0, beyond_bound="clip")
    t = checked(honest(reward=1e308, rewards={"a": -50.0, "b": 2.0}, turn_rewards=[99.0]), clip)
    assert (t.reward, t.rewards, t.turn_rewards) == (10.0, {"a": -10.0, "b": 2.0}, [10.0])
    with pytest.raises(SchemaError, match="must be finite"):
        checked(honest(reward=math.nan), clip)


def test_the_warm_ups_demonstrations_pass() -> None:
    """SFT demonstrations train on tokens no policy version sampled (versions -1 under a loss
    mask of 1, logprobs 0): the warm-up's batches must pass (a first version of the checks
    refused them and stalled every warm-up at step 0)."""
    from astraflow.core.records import ChatMessage
    from astraflow.models.tiny import build_tokenizer
    from astraflow.producers.demos import demonstration
    from astraflow.producers.sources import TaskSpec

    tok = build_tokenizer("arith")
    demo = demonstration(tok, TaskSpec(id="t", prompt=[ChatMessage(role="user", content="2+3=")],
                                       reference={"answer": "5"}))
    assert trajectory_problem(demo, RecordLimits(vocab={"default": len(tok)})) is None


def test_a_failed_episode_with_no_tokens_is_not_refused() -> None:
    empty = honest(token_ids=b"", loss_mask=b"", logprobs=b"", versions=b"", prompt_len=0,
                   spans=[], finish_reason="error", reward=0.0)
    assert trajectory_problem(empty, LIMITS) is None


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_bound_that_is_no_positive_finite_number_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="reward_bound"):
        RecordLimits(reward_bound=bad)
