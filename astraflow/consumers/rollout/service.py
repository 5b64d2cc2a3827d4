"""Building a rollout worker from the experiment config (what ``astraflow rollout`` runs)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.consumers.rollout.config import SAMPLING_KEYS
from astraflow.consumers.rollout.engines.base import Engine, build_engine
from astraflow.consumers.rollout.registry import load_object
from astraflow.consumers.rollout.runtime import Runtime
from astraflow.consumers.rollout.tools import TOOLS
from astraflow.consumers.rollout.weights import WeightFollower
from astraflow.consumers.rollout.worker import RolloutWorker, WorkerStats
from astraflow.core.errors import ConfigError
from astraflow.core.metrics import component_id

log = logging.getLogger("astraflow.rollout")


def _fill(text: str, out: Path, policy: str = "") -> str:
    return text.replace("{out}", str(out.resolve())).replace("{policy}", policy)


def build_engines(config: Any, out: str | Path = ".") -> dict[str, Engine]:
    """One engine per hosted policy (``rollout.policies``, default: every policy)."""
    from astraflow.config import model_dir

    rc = config.rollout
    out = Path(out)
    policies = rc.policies or list(config.policies)
    unknown = [p for p in policies if p not in config.policies]
    if unknown:
        raise ConfigError(f"rollout.policies: {unknown} are not policies of this run "
                          f"({config.policies})")
    engines: dict[str, Engine] = {}
    for policy in policies:
        ec = rc.engine
        path = Path(_fill(ec.model, out, policy)) if ec.model else model_dir(config, policy, out)
        kwargs = ec.model_dump(exclude={"type", "model", *SAMPLING_KEYS})
        kwargs["checkpoint_dir"] = _fill(ec.checkpoint_dir, out, policy)
        engines[policy] = build_engine(ec.type, model_path=path, **kwargs)
    return engines


def build_worker(config: Any, out: str | Path = ".", *, bus: Any = None,
                 engines: dict[str, Engine] | None = None,
                 worker_id: str | None = None) -> RolloutWorker:
    """A :class:`RolloutWorker` for ``config`` (an ``ExperimentConfig``), with weight followers
    when ``rollout.weights.enabled`` and the engines can take weights (their syncers are built
    from the ``weights`` section: store or fetch, cache dir, rate limit)."""
    from astraflow.config import open_bus
    from astraflow.weights.config import build_syncer

    rc = config.rollout
    out = Path(out)
    worker_id = worker_id or component_id("rollout")
    for module in rc.workflow.modules:
        importlib.import_module(module)
    for name, path in rc.tools.items():
        TOOLS.add(name, load_object(path, "tool"))
    bus = bus or open_bus(config, out)
    engines = engines or build_engines(config, out)
    runtime = Runtime.create(
        engines, reward=rc.reward.name, reward_kwargs=rc.reward.kwargs,
        reward_timeout=rc.reward.timeout, tool_timeout=rc.tool_timeout,
        sampling={k: getattr(rc.engine, k) for k in SAMPLING_KEYS},
        default_workflow=rc.workflow.default,
        workflow_kwargs=rc.workflow.kwargs)
    followers = []
    if rc.weights.enabled:
        for policy, engine in engines.items():
            target = engine.weight_target()
            if target is None:
                log.warning("policy=%s engine=%s takes no weight updates; its version stays "
                            "at %d", policy, engine.name, engine.version)
                continue
            syncer = build_syncer(bus, config.weights, target, run=config.run, policy=policy,
                                  worker=worker_id, out=out)
            followers.append(WeightFollower(syncer, engine=engine,
                                            poll_interval=rc.weights.poll_interval))
    return RolloutWorker(
        bus, runtime, run=config.run, worker_id=worker_id, group=rc.group_for(config.run),
        max_concurrent_episodes=rc.max_concurrent_episodes, episode_timeout=rc.episode_timeout,
        session_timeout=rc.session_timeout, drain_timeout=rc.drain_timeout,
        poll_timeout=rc.poll_timeout, commit_interval=rc.commit_interval,
        metrics_interval=rc.metrics_interval, followers=followers)


def run_worker(config: Any, out: str | Path = ".", *, max_tasks: int | None = None,
               timeout: float | None = None, should_stop: Callable[[], bool] | None = None,
               worker_id: str | None = None,
               on_ready: Callable[[RolloutWorker], None] | None = None) -> WorkerStats:
    """Build the worker from ``config`` and run it until stopped; closes what it opened."""
    worker = build_worker(config, out, worker_id=worker_id)
    try:
        if on_ready is not None:
            on_ready(worker)
        return worker.run(max_tasks=max_tasks, timeout=timeout, should_stop=should_stop)
    finally:
        for engine in worker.runtime.engines.values():
            engine.close()
        worker.bus.close()
