"""Roles on the rollout side: every draft and trajectory names the role (agent) it was played
in, one policy may play two roles, and a failed, timed-out or oversized episode still gives one
record per (policy, role) with the episode's version vector."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from rollout_helpers import ScriptedEngine, produce, read_all

from astraflow.config import ExperimentConfig
from astraflow.consumers.rollout.context import EpisodeContext
from astraflow.consumers.rollout.engines.base import GenRequest, GenResult
from astraflow.consumers.rollout.runtime import EpisodeOutcome, Runtime, run_episode
from astraflow.consumers.rollout.workflows import WORKFLOWS
from astraflow.consumers.rollout.workflows.contracts import CHECK
from astraflow.consumers.rollout.workflows.roles import role_policies
from astraflow.core.limits import too_large
from astraflow.core.records import (
    ChatMessage,
    Task,
    Trajectory,
    TurnSpan,
    pack_f32,
    pack_i32,
    pack_u8,
)
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_worker


@pytest.fixture(autouse=True)
def _fresh_check() -> Iterator[None]:
    CHECK.reset()
    yield
    CHECK.reset()


class SlowAfter(ScriptedEngine):
    """A scripted engine whose calls after the first ``fast`` ones take ``delay`` seconds."""

    def __init__(self, tokenizer: Any, script: Sequence[str], *, fast: int, delay: float,
                 version: int = 0) -> None:
        super().__init__(tokenizer, script, version=version)
        self.fast, self.delay = fast, delay

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        if len(self.calls) >= self.fast:
            time.sleep(self.delay)
        return super().generate(requests)


class Broken(ScriptedEngine):
    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        raise RuntimeError("engine fell over")


def task(workflow: str, *, answer: str = "5", n: int = 1) -> Task:
    return Task(id="q0", dataset="t", prompt=[ChatMessage(role="user", content="2+3=")],
                reference={"answer": answer}, workflow=workflow, n_samples=n)


def episode(engines: Mapping[str, Any], workflow: str, kwargs: Mapping[str, Any], *,
            timeout: float | None = None) -> EpisodeOutcome:
    rt = Runtime.create(dict(engines), reward="exact_match", sampling={"max_new_tokens": 50},
                        workflow_kwargs={workflow: dict(kwargs)})

    async def go() -> EpisodeOutcome:
        try:
            return await run_episode(rt, task(workflow), 0, timeout=timeout)
        finally:
            await rt.close()

    return asyncio.run(go())


def summary(out: EpisodeOutcome) -> list[tuple[str, str, str]]:
    return [(d.policy, d.agent, d.finish_reason) for d in out.drafts]


def test_one_policy_playing_both_roles_gives_each_draft_its_role(ascii_tokenizer) -> None:
    engine = ScriptedEngine(ascii_tokenizer, ["5", "fine. VERDICT: approve"], version=2)
    out = episode({"default": engine}, "solver_verifier",
                  {"policies": {"solver": "default", "verifier": "default"}})
    assert out.error is None
    assert summary(out) == [("default", "solver", "stop"), ("default", "verifier", "stop")]
    assert [d.reward for d in out.drafts] == [1.0, 1.0]


def test_separate_policies_name_their_roles_too(ascii_tokenizer) -> None:
    out = episode({"solver": ScriptedEngine(ascii_tokenizer, ["5", "4"]),
                   "selector": ScriptedEngine(ascii_tokenizer, ["CHOICE: 1"])},
                  "solver_selector", {"k": 2})
    assert summary(out) == [("solver", "solver", "stop"), ("selector", "selector", "stop")]


@pytest.mark.parametrize("shared", [False, True])
def test_a_timed_out_solver_selector_gives_one_record_per_role(ascii_tokenizer,
                                                               shared: bool) -> None:
    """The k candidates were generated, the selector is stuck: one solver record (the first
    candidate's tokens), one empty selector record, both ``timeout`` — never k solver
    records for one sample."""
    script = ["5", "4", "3", "CHOICE: 1"]
    if shared:
        engines: dict[str, Any] = {"default": SlowAfter(ascii_tokenizer, script, fast=3,
                                                        delay=1.5)}
        policies = {"solver": "default", "selector": "default"}
    else:
        engines = {"solver": ScriptedEngine(ascii_tokenizer, script[:3]),
                   "selector": SlowAfter(ascii_tokenizer, script[3:], fast=0, delay=1.5)}
        policies = {}
    out = episode(engines, "solver_selector", {"k": 3, "policies": policies}, timeout=0.5)
    assert out.timed_out
    solver_policy = "default" if shared else "solver"
    selector_policy = "default" if shared else "selector"
    assert summary(out) == [(solver_policy, "solver", "timeout"),
                            (selector_policy, "selector", "timeout")]
    solver, selector = out.drafts
    first = ascii_tokenizer.decode([t for t, m in zip(solver.token_ids, solver.loss_mask,
                                                      strict=True) if m],
                                   skip_special_tokens=True)
    assert first == "5" and solver.reward == 0.0
    assert selector.token_ids == [] and "timed out" in (selector.error or "")


def test_a_failing_episode_gives_every_declared_role_a_failed_record(ascii_tokenizer) -> None:
    """The verifier's engine fails before the verifier's conversation generated anything:
    the verifier's group still hears of the sample, as the verifier."""
    out = episode({"solver": ScriptedEngine(ascii_tokenizer, ["5"]),
                   "verifier": Broken(ascii_tokenizer, [])}, "solver_verifier", {})
    assert "engine fell over" in (out.error or "")
    assert summary(out) == [("solver", "solver", "error"), ("verifier", "verifier", "error")]


def test_a_conversation_in_a_role_the_policy_does_not_play_is_refused(ascii_tokenizer) -> None:
    async def wrong(ctx: EpisodeContext, task: Task) -> Any:
        role_policies(ctx, "wrong", ("solver", "verifier"), None)
        assert ctx.conversation(policy="verifier").agent == "verifier"  # its one role
        ctx.conversation(policy="solver", agent="verifier")

    WORKFLOWS.add("test_wrong_role", wrong)
    out = episode({"solver": ScriptedEngine(ascii_tokenizer, []),
                   "verifier": ScriptedEngine(ascii_tokenizer, [])}, "test_wrong_role", {})
    assert "role 'verifier' is not played by policy 'solver'" in (out.error or "")
    assert summary(out) == [("solver", "solver", "error"), ("verifier", "verifier", "error")]


def test_too_large_keeps_the_role_and_the_version_vector() -> None:
    rec = Trajectory(id="g#0/default/0.1", task_id="g", group_id="g#0", policy="default",
                     agent="verifier", sample_index=3, group_size=4,
                     token_ids=pack_i32([1, 2, 3]), loss_mask=pack_u8([0, 1, 1]),
                     logprobs=pack_f32([0, -1, -1]), versions=pack_i32([-1, 5, 5]),
                     prompt_len=1, reward=1.0, worker_id="w", version_vector={"default": 5,
                                                                             "solver": 2},
                     spans=[TurnSpan(start=0, end=1, role="prompt"),
                            TurnSpan(start=1, end=3, role="assistant")], turn_rewards=[1.0])
    small = too_large(rec, ValueError("record of 9 bytes"))
    assert small.spans == [] and small.turn_rewards == []  # no turns left, no turn rewards
    assert (small.id, small.group_id, small.policy, small.agent, small.sample_index,
            small.group_size, small.version_vector, small.worker_id) == (
        rec.id, rec.group_id, "default", "verifier", 3, 4, {"default": 5, "solver": 2}, "w")
    assert small.finish_reason == "error" and small.token_ids == b"" and small.reward == 0.0
    assert "too large for the bus: record of 9 bytes" in (small.error or "")


def test_the_worker_writes_roles_and_keeps_them_on_an_oversized_record(
        tmp_path: Path, ascii_tokenizer: Any) -> None:
    """One policy plays both roles; the verifier's trajectory is over the bus limit (no claim
    store): its stand-in keeps the role and the version vector, the solver's is whole."""
    cfg = ExperimentConfig.model_validate({
        "run": f"r{uuid.uuid4().hex[:8]}", "bus": {"url": f"embedded://{tmp_path}/bus.db",
                                                   "claims": None},
        "rollout": {"weights": {"enabled": False}, "commit_interval": 0.05,
                    "poll_timeout": 0.05, "engine": {"max_new_tokens": 250},
                    "workflow": {"kwargs": {"solver_verifier": {
                        "policies": {"solver": "default", "verifier": "default"},
                        "retry": False}}}}})
    bus = open_bus(cfg, tmp_path)
    try:
        bus.max_message_bytes = 2500  # type: ignore[attr-defined]
        engine = ScriptedEngine(ascii_tokenizer, ["5", "x" * 190 + " VERDICT: approve"],
                                version=4)
        produce(bus, cfg.run, [task("solver_verifier")])
        worker = configured_worker(cfg, tmp_path, bus=bus, engines={"default": engine},
                              worker_id="w-agents")
        worker.run(max_tasks=1)
        trajs = read_all(bus, topic_name(cfg.run, "trajectories"))
    finally:
        bus.close()
    by_agent = {t.agent: t for t in trajs}
    assert sorted(by_agent) == ["solver", "verifier"] and len(trajs) == 2
    solver, verifier = by_agent["solver"], by_agent["verifier"]
    assert verifier.finish_reason == "error" and "too large" in (verifier.error or "")
    assert solver.version_vector == verifier.version_vector == {"default": 4}
    assert (verifier.policy, verifier.group_size, verifier.id) == (
        "default", 1, "q0#0/default/0.1")
    assert solver.finish_reason == "stop" and solver.id == "q0#0/default/0"
