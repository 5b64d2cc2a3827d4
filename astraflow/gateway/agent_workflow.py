"""``openai_agent``: a user's agent written only against the OpenAI SDK, trained as it is.

The config names the agent (``module.path:function``, importable where the worker runs);
other kwargs go to the agent, except sampling keys and ``gateway``::

    rollout:
      workflow:
        default: openai_agent
        kwargs:
          openai_agent: {agent: "my_agents.solver:episode", max_turns: 3}

The function plays one episode and returns its reward (a number) or its final answer (a
string, scored by the configured reward)::

    def episode(client: openai.OpenAI, task: dict, **kwargs) -> float | str

``client`` points at this episode's session of the worker's gateway
(:mod:`astraflow.gateway.local`); the session's calls become the episode's trajectories.
Details: docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
import zlib
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.context import SAMPLING_KEYS, Draft, EpisodeContext, WorkflowError
from astraflow.consumers.rollout.rewards.base import Score
from astraflow.core.errors import AstraflowError
from astraflow.core.records import Task
from astraflow.core.registry import Registry
from astraflow.gateway.local import LocalGateway
from astraflow.gateway.trajectory import drafts

AGENTS: Registry[Any] = Registry("agent")  # module paths resolved once
_UNSAFE = re.compile(r"[^A-Za-z0-9._:@-]")


def session_id(task: Task, sample_index: int) -> str:
    """The gateway session of sample ``sample_index`` of ``task`` (this attempt):
    ``{task id}.{attempt}.{sample}``, the task id made URL-safe (characters outside
    ``[A-Za-z0-9._:@-]`` become ``_``, and then a hash of the id keeps it unique)."""
    safe = _UNSAFE.sub("_", task.id)[:80]
    if safe != task.id or not safe[:1].isalnum():
        safe = f"t{safe}-{zlib.crc32(task.id.encode()):08x}"
    return f"{safe}.{task.attempt}.{sample_index}"


def task_view(task: Task, sample_index: int) -> dict[str, Any]:
    """What the agent is given of ``task``."""
    return {"id": task.id, "dataset": task.dataset,
            "prompt": [{"role": m.role, "content": m.content,
                        **({"name": m.name} if m.name else {})} for m in task.prompt],
            "reference": dict(task.reference), "metadata": dict(task.metadata),
            "group_id": task.resolved_group_id(), "attempt": task.attempt,
            "sample_index": sample_index, "n_samples": task.n_samples}


def _openai() -> Any:
    try:
        import openai
    except ImportError:
        raise AstraflowError("the openai_agent workflow runs agents written against the "
                             "OpenAI SDK: pip install openai") from None
    return openai


async def openai_agent(ctx: EpisodeContext, task: Task, *, agent: str,
                       gateway: Mapping[str, Any] | None = None, **kwargs: Any) -> list[Draft]:
    """See the module docstring."""
    fn = AGENTS.resolve(agent)
    sampling = {k: kwargs.pop(k) for k in list(kwargs)
                if k in SAMPLING_KEYS or k == "max_tokens"}
    local = await LocalGateway.of(ctx.runtime, gateway)
    sid = await local.open(session_id(task, ctx.sample_index), {
        "task_id": task.id, "group_id": task.resolved_group_id(),
        "sample_index": ctx.sample_index, "group_size": task.n_samples},
        ctx.sampling(sampling) if sampling else None)
    view = task_view(task, ctx.sample_index)
    openai = _openai()
    # an HTTP client per episode, as an agent has (one shared by hundreds of episodes scans its
    # whole connection pool on every request); plain HTTP to 127.0.0.1: no SSL context to
    # load per client (slow), no proxy from the environment
    http = {"trust_env": False, "verify": False, "timeout": None}
    start = time.monotonic()
    try:
        if inspect.iscoroutinefunction(fn):
            async with openai.DefaultAsyncHttpxClient(**http) as h:
                client = openai.AsyncOpenAI(base_url=local.base_url(sid), api_key=local.token,
                                            max_retries=0, http_client=h)
                out = await fn(client, view, **kwargs)
        else:
            def play() -> Any:  # on an agent thread
                with openai.DefaultHttpxClient(**http) as h:
                    client = openai.OpenAI(base_url=local.base_url(sid), api_key=local.token,
                                           max_retries=0, http_client=h)
                    return fn(client, view, **kwargs)

            out = await asyncio.get_running_loop().run_in_executor(local.pool, play)
    finally:
        ctx.timings["agent"] = time.monotonic() - start  # its calls' generations included
        session = await local.take(sid)
    ctx.count("gateway_calls", len(session.calls))
    ctx.count("gateway_drift", session.drift)
    out_drafts = drafts(session)
    if not out_drafts:
        raise WorkflowError(f"agent {agent!r} made no call to the model in episode {sid!r}")
    if isinstance(out, str):
        reward: float | Score = await ctx.reward(out)
    elif isinstance(out, (int, float)) and not isinstance(out, bool):
        reward = float(out)
    else:
        raise WorkflowError(f"agent {agent!r} returned {type(out).__name__}; expected its "
                            "reward (a number) or its final answer (a str)")
    comps = dict(reward.components) if isinstance(reward, Score) else {}
    for d in out_drafts:
        d.reward, d.rewards = float(reward), comps
    return out_drafts
