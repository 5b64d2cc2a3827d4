"""Rollout as a service: workers, engines, workflows, rewards, tools (docs/rollout.md).

The public API (imported lazily: ``from astraflow.consumers.rollout import RolloutWorker``):

* :class:`~.worker.RolloutWorker`, :func:`~.service.build_worker`, :func:`~.service.run_worker`
* engines: :class:`~.engines.base.Engine`, :class:`~.engines.base.GenRequest`,
  :class:`~.engines.base.GenResult`, :func:`~.engines.base.build_engine`, ``ENGINES``
* workflows: ``WORKFLOWS`` and :class:`~.context.EpisodeContext`, :class:`~.context.Conversation`,
  :class:`~.context.Draft`; rewards: ``REWARDS``, :class:`~.rewards.base.Score`; tools: ``TOOLS``
* :class:`~.runtime.Runtime`, :func:`~.runtime.run_episode`

Modules:

- :mod:`.admission`: Which task's episodes start next: first come, first served, at most ``limit``
  episodes started and not finished.
- :mod:`.batcher`: The async front of an engine: collects the requests of concurrent episodes into
  batches.
- :mod:`.config`: Config section ``rollout``: the engine, workflow, reward, tools, concurrency,
  weight sync and drain settings of rollout workers.
- :mod:`.context`: What a workflow sees: the episode context, token-level conversations and their
  drafts.
- :mod:`.drain`: What a draining worker does with each task in flight: finish it or release it.
- :mod:`.latency`: Latency distributions: extra seconds a workflow waits at some point of an
  episode, standing in for a slow checker, a long analysis or a tool call.
- :mod:`.runtime`: The shared, per-worker part of every episode: engines.
- :mod:`.service`: Building a rollout worker from the ``rollout`` section plus what it shares with
  the run.
- :mod:`.tools`: Tools a workflow's model may call: Python callables by name, each call with a
  timeout.
- :mod:`.trajectories`: The Trajectory records of a task's episodes: one per policy's draft per
  sample, with ids ``"{group_id}/{policy}/{sample_index}"``.
- :mod:`.weights`: Following ``weights.<policy>``: a background thread per hosted policy.
- :mod:`.worker`: The rollout worker: a consumer of ``tasks`` and a producer of ``trajectories``,
  nothing more.
- :mod:`.engines` (a package): Inference engines behind one protocol (:mod:`.base`): ``hf``,
  ``vllm``, ``openai``.
- :mod:`.rewards` (a package): Rewards: ``fn(completion, reference, **kwargs) -> float | {"reward":
  float, ...}``.
- :mod:`.workflows` (a package): Workflows: ``async def workflow(ctx, task, **kwargs) -> Draft |
  list[Draft]``.
"""

from __future__ import annotations

from astraflow.core.registry import lazy_exports

_EXPORTS = {
    "RolloutWorker": "worker", "WorkerStats": "worker",
    "build_worker": "service", "run_worker": "service", "build_engines": "service",
    "Engine": "engines.base", "GenRequest": "engines.base", "GenResult": "engines.base",
    "build_engine": "engines.base", "ENGINES": "engines.base",
    "WORKFLOWS": "workflows", "REWARDS": "rewards", "Score": "rewards.base", "TOOLS": "tools",
    "EpisodeContext": "context", "Conversation": "context", "Draft": "context",
    "Generation": "context", "Runtime": "runtime", "run_episode": "runtime",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
