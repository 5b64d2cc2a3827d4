"""The ``openai_agent`` rollout workflow: a user's agent written only against the OpenAI SDK runs
against the worker's own gateway (in memory, over the runtime's batchers), and its episode
comes back as the drafts of its session: the sampled tokens, teacher-forced logprobs, the loss
mask over the model's tokens, the reward the agent returned or the configured reward of its
final answer. Errors of the agent fail the episode as any workflow's do."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import openai
import pytest
from agent_helpers import SAMPLED
from gateway_helpers import teacher_forced

from astraflow.consumers.rollout.runtime import Runtime, run_episode
from astraflow.core.records import ChatMessage, Task
from astraflow.gateway.agent_workflow import session_id
from astraflow.gateway.local import LocalGateway


@pytest.fixture(scope="module")
def engine(ascii_dir: Any) -> Any:
    """An hf engine of its own (the shared ``ascii_engine``'s random draws stay the other
    tests')."""
    from astraflow.consumers.rollout.engines import build_engine

    return build_engine("hf", model_path=ascii_dir, threads=1, seed=11)


def task(i: int, *, n: int = 1, answer: str = "42", attempt: int = 0) -> Task:
    return Task(id=f"arith/{i}+1", dataset="t", prompt=[ChatMessage(role="user",
                                                                    content=f"{i}+1=")],
                reference={"answer": answer}, workflow="openai_agent", n_samples=n,
                attempt=attempt)


def runtime(engine: Any, agent: str, **kwargs: Any) -> Runtime:
    return Runtime.create({"default": engine}, reward="exact_match",
                          sampling={"max_new_tokens": 6, "temperature": 1.0},
                          default_workflow="openai_agent",
                          workflow_kwargs={"openai_agent": {"agent": agent, **kwargs}})


def episodes(rt: Runtime, tasks: list[Task], timeout: float | None = None) -> list[Any]:
    async def run() -> list[Any]:
        try:
            return list(await asyncio.gather(*(run_episode(rt, t, i, timeout=timeout)
                                               for t in tasks for i in range(t.n_samples))))
        finally:
            await rt.close()
    return asyncio.run(run())


def test_episodes_are_their_sessions_sampled_tokens(engine: Any) -> None:
    SAMPLED.clear()
    rt = runtime(engine, "agent_helpers:two_turns")
    tasks = [task(1, n=3), task(2, n=3)]
    outs = episodes(rt, tasks)
    assert len(outs) == 6 and all(o.error is None for o in outs), [o.error for o in outs]
    for o in outs:
        (d,) = o.drafts
        t, i = o.ctx.task, o.ctx.sample_index
        assert d.policy == "default" and d.reward == 0.0  # the random model's text != "42"
        # the generated tokens are exactly the two sampled turns, in order
        gen = [x for x, m in zip(d.token_ids, d.loss_mask, strict=True) if m]
        assert gen == [x for turn in SAMPLED[(t.id, i)] for x in turn]
        assert [s.role for s in d.spans] == ["prompt", "assistant", "user", "assistant"]
        assert d.prompt_len == d.spans[0].end
        forced = teacher_forced(engine.model, d.token_ids)
        lp = [(a, b) for a, b, m in zip(d.logprobs, forced, d.loss_mask, strict=True) if m]
        assert max(abs(a - b) for a, b in lp) < 1e-4
        assert all(v == engine.version for v, m in zip(d.versions, d.loss_mask,
                                                             strict=True) if m)
        assert all(v == -1 and p == 0.0 for v, p, m in zip(d.versions, d.logprobs,
                                                           d.loss_mask, strict=True) if not m)
        assert o.ctx.counters["gateway_calls"] == 2 and o.ctx.counters["gateway_drift"] == 0
    # the generations went through the runtime's own batcher; the gateway made none
    assert rt.batchers["default"].requests == 12
    local = asyncio.run(_local(rt))
    assert local.gw._batchers == {} and local.gw.store.bus is None
    assert local.gw.store.open_count == 0  # every session taken


async def _local(rt: Runtime) -> LocalGateway:
    return await LocalGateway.of(rt)


@pytest.mark.parametrize(("agent", "kwargs", "reward"), [
    ("agent_helpers:two_turns", {"answer": "42"}, 1.0),   # a final answer: the run's reward
    ("agent_helpers:two_turns", {"answer": "41"}, 0.0),
    ("agent_helpers:two_turns", {"answer": 0.25}, 0.25),  # a number: the reward itself
    ("agent_helpers:async_two_turns", {}, 0.75),          # an async agent, AsyncOpenAI
])
def test_the_reward_is_the_agents(engine: Any, agent: str, kwargs: Mapping[str, Any],
                                  reward: float) -> None:
    (o,) = episodes(runtime(engine, agent, **kwargs), [task(3)])
    assert o.error is None, o.error
    (d,) = o.drafts
    assert d.reward == reward and sum(d.loss_mask) >= 2


@pytest.mark.parametrize(("agent", "error"), [
    ("agent_helpers:fails", "ValueError: the agent's own bug"),
    ("agent_helpers:silent", "made no call to the model"),
    ("agent_helpers:returns_none", "returned NoneType; expected its reward"),
    ("agent_helpers:nowhere", "has no attribute 'nowhere'"),
])
def test_an_agent_error_fails_the_episode(engine: Any, agent: str, error: str) -> None:
    rt = runtime(engine, agent)
    outs = episodes(rt, [task(4, n=2)])
    for o in outs:
        assert o.error is not None and error in o.error, o.error
        (d,) = o.drafts
        assert d.finish_reason == "error" and d.token_ids == []


def test_a_timed_out_episode_closes_its_session(engine: Any) -> None:
    rt = runtime(engine, "agent_helpers:slow")
    SAMPLED.clear()
    (o,) = episodes(rt, [task(5)], timeout=0.5)
    assert o.timed_out and o.drafts[0].finish_reason in ("error", "timeout")


def test_greedy_sampling_from_the_workflow_kwargs(engine: Any) -> None:
    """Sampling keys among the kwargs are the defaults of the episode's calls (the evaluator
    passes temperature 0): two samples of one task then sample the same tokens."""
    SAMPLED.clear()
    rt = runtime(engine, "agent_helpers:two_turns", temperature=0.0, max_tokens=3)
    outs = episodes(rt, [task(6, n=2)])
    assert all(o.error is None for o in outs), [o.error for o in outs]
    first, second = (SAMPLED[(o.ctx.task.id, o.ctx.sample_index)] for o in outs)
    assert first == second and all(len(t) <= 3 for t in first)


def test_a_closed_session_refuses_late_calls(engine: Any) -> None:
    rt = runtime(engine, "agent_helpers:two_turns")

    async def run() -> None:
        local = await LocalGateway.of(rt)
        sid = await local.open("late", {"task_id": "t"})
        assert await local.open("late", {"task_id": "t"}) == "late.r1"  # taken: another id
        s = await local.take(sid)
        assert s.calls == {} and s.done
        stranger = openai.AsyncOpenAI(base_url=local.base_url("late.r1"), api_key="-",
                                      max_retries=0)
        with pytest.raises(openai.AuthenticationError):  # only the workflow's clients get in
            await stranger.chat.completions.create(model="default", messages=[
                {"role": "user", "content": "hi"}])
        client = openai.AsyncOpenAI(base_url=local.base_url(sid), api_key=local.token,
                                    max_retries=0)
        with pytest.raises(openai.ConflictError) as e:
            await client.chat.completions.create(model="default", messages=[
                {"role": "user", "content": "hi"}])
        assert e.value.body["code"] == "session_closed"
        assert (await local.take("late.r1")).calls == {}  # the stranger's call: not recorded
        await rt.close()

    asyncio.run(run())


def test_session_ids_are_url_safe_and_distinct() -> None:
    a, b = task(7), Task(id="arith/7_1", dataset="t", prompt=[], workflow="openai_agent")
    ids = {session_id(a, 0), session_id(a, 1), session_id(b, 0), session_id(task(7, attempt=1), 0)}
    assert len(ids) == 4
    assert all(len(s) <= 128 and s.replace(".", "").replace("-", "").replace("_", "")
               .replace(":", "").replace("@", "").isalnum() for s in ids)
    plain = Task(id="t1", dataset="t", prompt=[], workflow="openai_agent", attempt=2)
    assert session_id(plain, 5) == "t1.2.5"


def test_gateway_options_are_checked(engine: Any) -> None:
    (o,) = episodes(runtime(engine, "agent_helpers:two_turns",
                            gateway={"on_drift": "segment", "port": 1}), [task(8)])
    assert "openai_agent.gateway: unknown key(s) port; valid: aliases, on_drift" in o.error
    (o,) = episodes(runtime(engine, "agent_helpers:two_turns",
                            gateway={"on_drift": "segment"}), [task(8)])
    assert o.error is None, o.error


def test_the_evaluator_runs_the_agent_greedily(engine: Any) -> None:
    """The evaluator's episodes (greedy_episodes: a Runtime of their own per evaluation, on an
    event loop of their own) run the agent through a gateway of that runtime, greedily; the
    gateway of a finished evaluation is stopped when the next one starts."""
    import gc

    from astraflow.consumers.episodes import greedy_episodes
    from astraflow.gateway import local
    from astraflow.producers.sources import TaskSpec

    SAMPLED.clear()
    specs = [TaskSpec(id=f"e{i}", prompt=[ChatMessage(role="user", content=f"{i}+1=")],
                      reference={"answer": "x"}) for i in range(3)]
    # the evaluator passes the agent no kwargs of its own: it returns its text (reward 0), not
    # the 0.5 a worker would have it return
    kwargs = {"agent": "agent_helpers:two_turns", "answer": 0.5}
    first = greedy_episodes({"default": engine}, specs, workflow="openai_agent",
                            workflow_kwargs=kwargs, max_new_tokens=4)
    assert all(o.error is None and len(o.drafts) == 1 for o in first), [o.error for o in first]
    assert all(o.drafts[0].reward == 0.0 for o in first)
    again = dict(SAMPLED)
    SAMPLED.clear()
    second = greedy_episodes({"default": engine}, specs, workflow="openai_agent",
                             workflow_kwargs=kwargs, max_new_tokens=4)
    assert [o.drafts[0].token_ids for o in first] == [o.drafts[0].token_ids for o in second]
    assert again == SAMPLED  # greedy: the same tokens both times
    del first, second
    gc.collect()  # the evaluations' runtimes: their gateways stop
    assert local._RUNNING == {}


def test_a_gateway_start_cut_off_by_its_loop_closing_is_forgotten(monkeypatch: Any) -> None:
    """A worker whose event loop closes while its gateway is still starting (the start task is
    cancelled) leaves nothing behind: the cancelled start holds the runtime in its traceback, so
    its finalizer alone would never forget it. A failed start is forgotten as well (the next
    episode tries again)."""
    import contextlib

    from astraflow.gateway import local

    class Owner:  # only its identity matters before _start runs
        pass

    async def slow_start(runtime: Any, kwargs: Any) -> Any:
        await asyncio.sleep(60)

    async def failing_start(runtime: Any, kwargs: Any) -> Any:
        raise OSError("no port")

    runtime = Owner()
    before = dict(local._RUNNING)
    monkeypatch.setattr(local, "_start", slow_start)

    async def cut_off() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(local.LocalGateway.of(runtime), 0.05)  # type: ignore[arg-type]

    asyncio.run(cut_off())
    assert before == local._RUNNING
    monkeypatch.setattr(local, "_start", failing_start)
    with pytest.raises(OSError, match="no port"):
        asyncio.run(local.LocalGateway.of(runtime))  # type: ignore[arg-type]
    assert before == local._RUNNING


def test_rollout_names_the_agent_workflow_without_importing_the_gateway() -> None:
    """The gateway is a one-way client of rollout: rollout's workflows (and its worker) load
    without the gateway; the name ``openai_agent`` imports it on first use."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from astraflow.consumers.rollout.workflows import WORKFLOWS\n"
            "import astraflow.consumers.rollout.worker\n"
            "assert not [m for m in sys.modules if m.startswith('astraflow.gateway')], "
            "sorted(m for m in sys.modules if m.startswith('astraflow.gateway'))\n"
            "fn = WORKFLOWS.resolve('openai_agent')\n"
            "print(fn.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "astraflow.gateway.agent_workflow"


def test_a_worker_full_of_agents_is_not_refused_by_its_own_gateway(engine: Any) -> None:
    """The worker's gateway serves as many concurrent sessions as the worker runs episodes:
    the request limits of ``astraflow serve`` (a tokenizer queue of 64, answered 429 past it)
    are for clients the gateway does not know, and the agents' SDK clients do not retry (a CI
    run of the agent example failed 461 episodes that way). 300 agents make their calls at
    once; every one is served."""
    rt = runtime(engine, "agent_helpers:async_two_turns")
    outs = episodes(rt, [task(i, n=10) for i in range(30)])
    errors = [o.error for o in outs if o.error is not None]
    assert len(outs) == 300 and errors == [], errors[:3]
