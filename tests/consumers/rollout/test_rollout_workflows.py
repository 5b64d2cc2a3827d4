"""Workflows on a scripted engine (the workflow logic) and once on the tiny real model: the loss
mask covers exactly the model's tokens, tool output goes back into the conversation, tool
timeouts and errors are handled, several policies share an episode, failures are records."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from rollout_helpers import ScriptedEngine, make_task

from astraflow.consumers.rollout.context import Draft
from astraflow.consumers.rollout.engines import build_engine
from astraflow.consumers.rollout.runtime import EpisodeOutcome, Runtime, run_episode
from astraflow.consumers.rollout.tools import TOOLS
from astraflow.consumers.rollout.workflows import WORKFLOWS
from astraflow.consumers.rollout.workflows.multi_turn import ToolCallError, parse_tool_call
from astraflow.core.records import ChatMessage, Task


def run(runtime: Runtime, task: Task, index: int = 0, **kw: Any) -> EpisodeOutcome:
    async def go() -> EpisodeOutcome:
        try:
            return await run_episode(runtime, task, index, **kw)
        finally:
            await runtime.close()

    return asyncio.run(go())


def tool_task(question: str = "what is 2+3?", answer: str = "5") -> Task:
    return Task(id="q", dataset="t", prompt=[ChatMessage(role="user", content=question)],
                reference={"answer": answer}, workflow="multi_turn_tools", n_samples=1)


def assistant_tokens(draft: Draft) -> list[int]:
    return [t for t, m in zip(draft.token_ids, draft.loss_mask, strict=True) if m]


def test_parse_tool_call() -> None:
    assert parse_tool_call("no call here") is None
    assert parse_tool_call('x <tool>calculator({"expression": "1+1"})</tool>') == (
        "calculator", {"expression": "1+1"})
    assert parse_tool_call("<tool>now()</tool>") == ("now", {})
    # positional arguments: comma-separated JSON values (the short form a tiny model learns)
    assert parse_tool_call("<tool>mul(17,23)</tool>") == ("mul", [17, 23])
    assert parse_tool_call('<tool>f("a", [1], 2.5)</tool>') == ("f", ["a", [1], 2.5])
    for bad in ("<tool>calc(1+1)</tool>", "<tool>calc(1,)</tool>", "<tool>calc({})",
                "<tool>)(</tool>", '<tool>calc({"a": 1}, 2)</tool>'):
        with pytest.raises(ToolCallError):
            parse_tool_call(bad)


def test_multi_turn_mask_covers_exactly_the_model_tokens(ascii_tokenizer) -> None:
    tok = ascii_tokenizer
    turns = ['I will compute. <tool>calculator({"expression": "2+3"})</tool>', "The answer is 5"]
    engine = ScriptedEngine(tok, turns)
    rt = Runtime.create({"default": engine}, reward="numeric_match",
                        sampling={"max_new_tokens": 100})
    out = run(rt, tool_task())
    assert out.error is None
    (d,) = out.drafts
    # the model's tokens, in order: turn 1 (stopped by the stop string, no EOS), turn 2 + EOS
    want = (tok(turns[0], add_special_tokens=False)["input_ids"]
            + tok(turns[1], add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    assert assistant_tokens(d) == want
    assert sum(d.loss_mask) == len(want)
    # every masked-in token is inside an assistant span, every other token outside one
    for span in d.spans:
        assert set(d.loss_mask[span.start:span.end]) == {1 if span.role == "assistant" else 0}
    assert [s.role for s in d.spans] == ["prompt", "assistant", "tool", "assistant"]
    assert d.spans[0].start == 0 and d.spans[-1].end == len(d.token_ids)
    tool_text = tok.decode(d.token_ids[d.spans[2].start:d.spans[2].end])
    assert tool_text == "<result>5</result>"
    assert all(v == -1 for v, m in zip(d.versions, d.loss_mask, strict=True) if not m)
    assert all(lp == 0.0 for lp, m in zip(d.logprobs, d.loss_mask, strict=True) if not m)
    assert d.reward == 1.0 and d.finish_reason == "stop"
    assert out.ctx.counters == {"tool_calls": 1.0}
    assert "</tool>" in engine.calls[0].stop


def test_tool_timeout_is_reported_to_the_model(ascii_tokenizer) -> None:
    async def sleepy(seconds: float = 5.0) -> str:
        await asyncio.sleep(seconds)
        return "late"

    TOOLS.add("sleepy", sleepy)
    engine = ScriptedEngine(ascii_tokenizer, ["<tool>sleepy()</tool>", "5"])
    rt = Runtime.create({"default": engine}, reward="exact_match", tool_timeout=0.2,
                        sampling={"max_new_tokens": 100})
    out = run(rt, tool_task())
    (d,) = out.drafts
    assert out.error is None and d.reward == 1.0
    assert out.ctx.counters == {"tool_calls": 1.0, "tool_timeouts": 1.0}
    tool = d.spans[2]
    text = ascii_tokenizer.decode(d.token_ids[tool.start:tool.end])
    assert "timed out after 0.2 s" in text


@pytest.mark.parametrize(("call", "error"), [
    ("<tool>nope()</tool>", "unknown tool 'nope'"),
    ("<tool>calculator(1+1)</tool>", "not valid JSON"),
    ('<tool>calculator({"x": 1})</tool>', "bad arguments"),
    ('<tool>calculator({"expression": "__import__(1)"})</tool>', "raised ValueError"),
])
def test_tool_errors_go_back_into_the_conversation(ascii_tokenizer, call: str,
                                                   error: str) -> None:
    engine = ScriptedEngine(ascii_tokenizer, [call, "5"])
    rt = Runtime.create({"default": engine}, sampling={"max_new_tokens": 100})
    out = run(rt, tool_task())
    (d,) = out.drafts
    text = ascii_tokenizer.decode(d.token_ids[d.spans[2].start:d.spans[2].end])
    assert error in text and d.reward == 1.0 and out.error is None


def test_max_turns_ends_a_tool_loop(ascii_tokenizer) -> None:
    engine = ScriptedEngine(ascii_tokenizer, ['<tool>calculator({"expression": "1"})</tool>'] * 5)
    rt = Runtime.create({"default": engine}, workflow_kwargs={
        "multi_turn_tools": {"max_turns": 3}}, sampling={"max_new_tokens": 100})
    out = run(rt, tool_task())
    (d,) = out.drafts
    assert [s.role for s in d.spans].count("assistant") == 3
    assert d.finish_reason == "length" and d.reward == 0.0


def test_several_policies_in_one_episode(ascii_tokenizer) -> None:
    async def solve_and_verify(ctx: Any, task: Task) -> list[Draft]:
        solver = await ctx.generate(policy="solver", messages=task.prompt)
        verdict = await ctx.generate(policy="verifier", messages=[
            ChatMessage(role="user", content=f"Is {solver.text} right?")])
        good = await ctx.reward(solver.text)
        return [solver.conversation.finish(good),
                verdict.conversation.finish(1.0 if (verdict.text == "yes") == bool(good.value)
                                            else 0.0)]

    WORKFLOWS.add("test_solve_verify", solve_and_verify)
    rt = Runtime.create({"solver": ScriptedEngine(ascii_tokenizer, ["5"], version=3),
                         "verifier": ScriptedEngine(ascii_tokenizer, ["yes"], version=7)})
    task = tool_task()
    task.workflow = "test_solve_verify"
    out = run(rt, task)
    solver, verifier = out.drafts
    assert (solver.policy, verifier.policy) == ("solver", "verifier")
    assert (solver.reward, verifier.reward) == (1.0, 1.0)
    assert set(v for v in solver.versions if v >= 0) == {3}
    assert set(v for v in verifier.versions if v >= 0) == {7}


def test_user_module_workflow_and_failures_become_records(ascii_tokenizer) -> None:
    rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, ["x"])},
                        allow_workflow_paths=True)  # the task names a module path
    task = make_task(1, workflow="rollout_helpers:failing_workflow")
    out = run(rt, task)
    (d,) = out.drafts
    assert d.finish_reason == "error" and "boom in the workflow" in (d.error or "")
    assert d.token_ids == [] and out.error is not None


def test_reward_that_crashes_scores_zero_and_is_counted(ascii_tokenizer) -> None:
    def bad_reward(completion: str, reference: dict) -> float:
        raise ZeroDivisionError("oops")

    rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, ["5"])}, reward=bad_reward)
    out = run(rt, Task(id="s", dataset="t", prompt=[ChatMessage(role="user", content="2+3=")],
                       reference={"answer": "5"}))
    (d,) = out.drafts
    assert out.error is None and d.reward == 0.0 and d.rewards == {"reward_failed": 1.0}
    assert out.ctx.counters == {"reward_failures": 1.0}


def test_episode_timeout_keeps_the_tokens_so_far(ascii_tokenizer) -> None:
    async def stuck(ctx: Any, task: Task) -> Draft:
        gen = await ctx.generate(messages=task.prompt)
        await asyncio.sleep(30)
        return gen.conversation.finish(1.0)

    WORKFLOWS.add("test_stuck", stuck)
    rt = Runtime.create({"default": ScriptedEngine(ascii_tokenizer, ["abc"])})
    task = make_task(0, workflow="test_stuck")
    out = run(rt, task, timeout=0.3)
    (d,) = out.drafts
    assert out.timed_out and d.finish_reason == "timeout" and d.reward == 0.0
    assert len(assistant_tokens(d)) == 4  # "abc" + EOS


def test_multi_turn_on_the_tiny_real_model(ascii_dir: Path) -> None:
    """Random weights write random text: whatever it writes, the record stays consistent."""
    engine = build_engine("hf", model_path=ascii_dir, threads=1, seed=0)
    rt = Runtime.create({"default": engine}, sampling={"max_new_tokens": 12},
                        workflow_kwargs={"multi_turn_tools": {"max_turns": 2}})

    async def go() -> list[EpisodeOutcome]:
        try:
            return list(await asyncio.gather(*(run_episode(rt, tool_task(), i)
                                               for i in range(4))))
        finally:
            await rt.close()

    for out in asyncio.run(go()):
        (d,) = out.drafts
        assert out.error is None
        assert len(d.token_ids) == len(d.loss_mask) == len(d.logprobs) == len(d.versions)
        assert 1 <= sum(d.loss_mask) <= 24
        for span in d.spans:
            assert set(d.loss_mask[span.start:span.end]) == {1 if span.role == "assistant"
                                                             else 0}
        assert all(v == 0 for v, m in zip(d.versions, d.loss_mask, strict=True) if m)
        assert all(lp < 0 for lp, m in zip(d.logprobs, d.loss_mask, strict=True) if m)
