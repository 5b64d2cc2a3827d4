"""Replies cut at ``max_new_tokens`` (``rollout.reward.truncated``): under ``score`` the reward
scores the cut text, under ``zero`` the trajectory scores 0; a reply ended by EOS is scored
either way; the worker counts the cut replies (``replies_truncated``, ``truncated_fraction``),
on a scripted engine and on the tiny real model's hf engine."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from rollout_helpers import ScriptedEngine, make_task, produce, read_all

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.context import Draft, EpisodeContext
from astraflow.consumers.rollout.runtime import EpisodeOutcome, Runtime, run_episode
from astraflow.consumers.rollout.workflows import WORKFLOWS
from astraflow.core.errors import AstraflowError
from astraflow.core.records import ChatMessage, Metric, Task
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_worker


def run(runtime: Runtime, task: Task) -> EpisodeOutcome:
    async def go() -> EpisodeOutcome:
        try:
            return await run_episode(runtime, task, 0)
        finally:
            await runtime.close()

    return asyncio.run(go())


def sum_task(workflow: str = "single_turn") -> Task:
    return Task(id="s", dataset="t", prompt=[ChatMessage(role="user", content="2+3=")],
                reference={"answer": "5"}, workflow=workflow, n_samples=1)


@pytest.mark.parametrize(("rule", "script", "max_new", "want"), [
    # "5 and more" cut after one token is "5": the right last number, scored 1 by `score`
    ("score", "5 and more", 1, 1.0),
    ("zero", "5 and more", 1, 0.0),
    # "5" then EOS within the budget: not cut, scored under either rule
    ("score", "5", 2, 1.0),
    ("zero", "5", 2, 1.0),
])
def test_a_cut_reply_scores_by_the_rule(ascii_tokenizer, rule: str, script: str, max_new: int,
                                        want: float) -> None:
    rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, [script])},
                        reward="numeric_match", sampling={"max_new_tokens": max_new},
                        truncated=rule)
    out = run(rt, sum_task())
    (d,) = out.drafts
    cut = max_new == 1
    assert out.error is None and d.reward == want
    assert d.finish_reason == ("length" if cut else "stop")
    assert d.rewards.get("truncated") == (1.0 if cut else None)
    assert (out.ctx.replies, out.ctx.replies_truncated) == (1, int(cut))


@pytest.mark.parametrize(("rule", "want"), [("score", 1.0), ("zero", 0.0)])
def test_a_cut_earlier_turn_decides_a_multi_turn_episode(ascii_tokenizer, rule: str,
                                                         want: float) -> None:
    """Turn 1, a tool call, is cut at 10 tokens (an unterminated call: an error result); turn 2
    answers "5" and ends with EOS. The episode's reward is the answer's under ``score``, 0
    under ``zero``."""
    engine = ScriptedEngine(ascii_tokenizer, ['<tool>calculator({"expression": "2+3"})</tool>',
                                              "5"])
    rt = Runtime.create({"default": engine}, reward="numeric_match",
                        sampling={"max_new_tokens": 10}, truncated=rule)
    out = run(rt, sum_task("multi_turn_tools"))
    (d,) = out.drafts
    tool = next(s for s in d.spans if s.role == "tool")
    assert "unterminated tool call" in ascii_tokenizer.decode(d.token_ids[tool.start:tool.end])
    assert d.finish_reason == "stop" and d.rewards["truncated"] == 1.0 and d.reward == want
    assert (out.ctx.replies, out.ctx.replies_truncated) == (2, 1)


@pytest.mark.parametrize(("rule", "want"), [("score", [1.0, 1.0]), ("zero", [1.0, 0.0])])
def test_zero_scores_the_cut_turns_of_turn_rewards_0(ascii_tokenizer, rule: str,
                                                     want: list[float]) -> None:
    async def two_turns(ctx: EpisodeContext, task: Task) -> Draft:
        gen = await ctx.generate(messages=task.prompt, max_new_tokens=4)
        gen.conversation.add(ChatMessage(role="user", content="again"))
        await gen.conversation.generate(max_new_tokens=2)  # "long" cut to "lo"
        return gen.conversation.finish(1.0, turn_rewards=[1.0, 1.0])

    WORKFLOWS.add("test_two_turns_cut", two_turns)
    rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, ["ok", "long"])},
                        truncated=rule)
    (d,) = run(rt, sum_task("test_two_turns_cut")).drafts
    assert d.turn_rewards == want and d.reward == (1.0 if rule == "score" else 0.0)
    assert d.finish_reason == "length"


def test_an_unknown_rule_is_refused(ascii_tokenizer) -> None:
    with pytest.raises(AstraflowError, match="unknown truncated rule 'drop'; valid: score, zero"):
        Runtime.create({"default": ScriptedEngine(ascii_tokenizer, [])}, truncated="drop")
    with pytest.raises(ValueError, match="truncated"):
        ExperimentConfig.model_validate({"run": "r", "rollout": {"reward": {"truncated": "drop"}}})


def test_the_worker_zeroes_and_counts_cut_replies_of_a_real_engine(tmp_path: Path,
                                                                   arith_dir: Path) -> None:
    """The tiny model's hf engine with 2 new tokens cuts most replies; a reward that gives
    every completion 1 shows which ones ``zero`` scored 0: exactly those the engine cut, which
    the worker's counters count."""
    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}",
        "bus": {"url": f"embedded://{tmp_path}/bus.db", "partitions": {"tasks": 2}},
        "rollout": {"engine": {"model": str(arith_dir), "threads": 1, "max_new_tokens": 2},
                    "reward": {"name": "rollout_helpers:one_reward", "truncated": "zero"},
                    "weights": {"enabled": False}, "metrics_interval": 0.2,
                    "commit_interval": 0.05, "poll_timeout": 0.05}})
    bus = open_bus(cfg, tmp_path)
    try:
        produce(bus, cfg.run, [make_task(i, n=4) for i in range(4)])
        stats = configured_worker(cfg, tmp_path, bus=bus, worker_id="w-cut").run(max_tasks=4)
        trajs = read_all(bus, topic_name(cfg.run, "trajectories"))
        metrics = [m for m in read_all(bus, topic_name(cfg.run, "metrics"), Metric)
                   if m.component == "w-cut"]
    finally:
        bus.close()
    assert len(trajs) == 16 and all(t.error is None for t in trajs)
    cut = [t for t in trajs if t.finish_reason == "length"]
    assert cut, "2 new tokens cut no reply of the untrained model"
    for t in trajs:
        assert (t.reward == 0.0) == (t.finish_reason == "length")
        assert t.rewards.get("truncated") == (1.0 if t.finish_reason == "length" else None)
    assert (stats.replies, stats.replies_truncated) == (16, len(cut))
    last = metrics[-1]
    assert last.status == "stopped"
    assert (last.counters["replies"], last.counters["replies_truncated"]) == (16, len(cut))
    assert 0.0 < last.gauges["truncated_fraction"] <= 1.0
