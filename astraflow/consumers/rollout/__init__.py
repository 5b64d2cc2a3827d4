"""Rollout as a service: workers, engines, workflows, rewards, tools (docs/rollout.md).

The public API is imported lazily, e.g. ``from astraflow.consumers.rollout import
RolloutWorker``: :class:`~.worker.RolloutWorker`, :func:`~.service.build_worker`,
:func:`~.service.run_worker`, the engine protocol (:mod:`.engines.base`), the registries
``ENGINES``, ``WORKFLOWS``, ``REWARDS`` and ``TOOLS``, the episode context
(:mod:`.context`) and :func:`~.runtime.run_episode`.

Modules:

- :mod:`.admission`: which task's episodes start next.
- :mod:`.batcher`: the async front of an engine: batches the requests of concurrent episodes.
- :mod:`.config`: config section ``rollout``.
- :mod:`.context`: what a workflow sees: the episode context, conversations, drafts.
- :mod:`.drain`: what a draining worker does with each task in flight.
- :mod:`.latency`: latency distributions a workflow can wait on.
- :mod:`.runtime`: the shared, per-worker part of every episode.
- :mod:`.service`: building a rollout worker from the ``rollout`` section.
- :mod:`.tools`: tools a workflow's model may call.
- :mod:`.trajectories`: the Trajectory records of a task's episodes.
- :mod:`.weights`: following ``weights.<policy>``, a thread per hosted policy.
- :mod:`.worker`: the rollout worker: ``tasks`` in, ``trajectories`` out.
- :mod:`.engines` (a package): inference engines behind one protocol.
- :mod:`.rewards` (a package): rewards and the code sandbox.
- :mod:`.workflows` (a package): workflows, built-in and registered.
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
