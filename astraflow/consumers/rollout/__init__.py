"""Rollout as a service: workers, engines, workflows, rewards, tools (docs/rollout.md).

The public API (imported lazily: ``from astraflow.consumers.rollout import RolloutWorker``):

* :class:`~.worker.RolloutWorker`, :func:`~.service.build_worker`, :func:`~.service.run_worker`
* engines: :class:`~.engines.base.Engine`, :class:`~.engines.base.GenRequest`,
  :class:`~.engines.base.GenResult`, :func:`~.engines.base.build_engine`, ``ENGINES``
* workflows: ``WORKFLOWS`` and :class:`~.context.EpisodeContext`, :class:`~.context.Conversation`,
  :class:`~.context.Draft`; rewards: ``REWARDS``, :class:`~.rewards.base.Score`; tools: ``TOOLS``
* :class:`~.runtime.Runtime`, :func:`~.runtime.run_episode`
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
