"""Greedy episodes for evaluation: a run's workflow run at temperature 0 on held-out problems.

Episodes go through the rollout :func:`~astraflow.consumers.rollout.runtime.run_episode`, as
the rollout workers run them minus the sampling, every problem at once so the engines batch
the turns. Used by the evaluator's ``episode`` kind and by the team evaluator; injected
latencies (``verifier_latency``, ``tool_latency``) are left out.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from astraflow.core.records import Task
from astraflow.producers.sources import TaskSpec

if TYPE_CHECKING:
    from astraflow.consumers.rollout.engines.base import Engine

#: sampling keys the evaluation pins (greedy) whatever the workflow's kwargs say
SAMPLED = ("temperature", "top_p")
#: kwargs left out: simulated slow checkers and tools measure the pipeline, not the answers
LEFT_OUT = ("verifier_latency", "tool_latency")


def greedy_kwargs(workflow: str, kwargs: Mapping[str, Any],
                  temperature: float = 0.0) -> dict[str, Any]:
    """``workflow``'s kwargs for an evaluation: ``temperature`` (0: greedy) for every role
    (shared and per-role overrides), top-p dropped; injected latencies and keys the workflow
    function does not take left out."""
    from astraflow.consumers.rollout.context import SAMPLING_KEYS
    from astraflow.consumers.rollout.workflows import WORKFLOWS

    params = inspect.signature(WORKFLOWS.resolve(workflow)).parameters
    out = {k: v for k, v in kwargs.items() if k not in LEFT_OUT and (
        (k in params and k != "role_sampling") or k in SAMPLING_KEYS)}
    for k in SAMPLED:
        out.pop(k, None)
    out["temperature"] = temperature
    per_role = {role: {k: v for k, v in dict(s).items() if k not in SAMPLED}
                for role, s in dict(kwargs.get("role_sampling") or {}).items()}
    if per_role:
        out["role_sampling"] = per_role
    return out


def greedy_episodes(engines: Mapping[str, Engine], specs: Sequence[TaskSpec], *, workflow: str,
                    reward: str = "exact_match", reward_kwargs: Mapping[str, Any] | None = None,
                    workflow_kwargs: Mapping[str, Any] | None = None,
                    max_new_tokens: int = 64, temperature: float = 0.0,
                    extract: str = "none") -> list[Any]:
    """The :class:`EpisodeOutcome` of ``workflow`` run greedily (or at ``temperature``) on
    every spec (one sample each). ``engines``: policy -> engine, every policy the workflow
    uses; ``extract``: the reward's answer extractor (``rollout.reward.extract``)."""
    kwargs = greedy_kwargs(workflow, workflow_kwargs or {}, temperature)
    tasks = [Task(id=s.id, dataset="eval", prompt=s.prompt, reference=s.reference,
                  workflow=workflow, n_samples=1) for s in specs]
    return asyncio.run(_run_all(engines, tasks, workflow=workflow, reward=reward,
                                reward_kwargs=reward_kwargs, kwargs=kwargs, extract=extract,
                                max_new_tokens=max_new_tokens, temperature=temperature))


def episode_accuracy(engines: Mapping[str, Engine], specs: Sequence[TaskSpec], *,
                     workflow: str, threshold: float = 0.5, **kw: Any) -> float:
    """The fraction of ``specs`` whose greedy episode ends with a reward > ``threshold`` (the
    episode's only trajectory, or its first; a failed episode counts as wrong)."""
    outs = greedy_episodes(engines, specs, workflow=workflow, **kw)
    right = sum(o.error is None and bool(o.drafts) and o.drafts[0].reward > threshold
                for o in outs)
    return right / max(1, len(outs))


async def _run_all(engines: Mapping[str, Engine], tasks: Sequence[Task], *, workflow: str,
                   reward: str, reward_kwargs: Mapping[str, Any] | None, kwargs: dict[str, Any],
                   max_new_tokens: int, temperature: float, extract: str) -> list[Any]:
    from astraflow.consumers.rollout.runtime import Runtime, run_episode

    rt = Runtime.create(engines, reward=reward, reward_kwargs=reward_kwargs, extract=extract,
                        sampling={"temperature": temperature, "max_new_tokens": max_new_tokens},
                        default_workflow=workflow, workflow_kwargs={workflow: kwargs})
    try:
        return list(await asyncio.gather(*(run_episode(rt, t, 0) for t in tasks)))
    finally:
        await rt.close()
