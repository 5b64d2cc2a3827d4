"""Building a rollout worker from the ``rollout`` section plus what it shares with the run
(name, policies and their models, the ``weights`` section): what ``astraflow rollout`` runs,
through :mod:`astraflow.run.roles`."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.consumers.rollout.config import SAMPLING_KEYS, RolloutConfig
from astraflow.consumers.rollout.engines.base import Engine, build_engine
from astraflow.consumers.rollout.engines.speed import slowed
from astraflow.consumers.rollout.rewards.sandbox import configure
from astraflow.consumers.rollout.runtime import Runtime
from astraflow.consumers.rollout.tools import TOOLS
from astraflow.consumers.rollout.weights import WeightFollower
from astraflow.consumers.rollout.worker import RolloutWorker, WorkerStats
from astraflow.core.errors import ConfigError
from astraflow.core.metrics import component_id
from astraflow.core.paths import expand
from astraflow.core.registry import load_object
from astraflow.models.config import ModelConfig, model_dir
from astraflow.models.source import resolve

if TYPE_CHECKING:
    from astraflow.core.bus.types import Bus
    from astraflow.core.claims import BlobStore
    from astraflow.weights.config import WeightsConfig

log = logging.getLogger("astraflow.rollout")


def build_followers(engines: Mapping[str, Engine], bus: Bus, weights: WeightsConfig, *, run: str,
                    worker: str, out: str | Path = ".", poll_interval: float = 0.5
                    ) -> list[WeightFollower]:
    """A weight follower (not started) per engine that takes weight updates: what a rollout
    worker and the gateway run to follow ``weights.<policy>``."""
    from astraflow.weights.config import build_syncer

    followers = []
    for policy, engine in engines.items():
        target = engine.weight_target()
        if target is None:
            log.warning("policy=%s engine=%s takes no weight updates; its version stays "
                        "at %d", policy, engine.name, engine.version)
            continue
        syncer = build_syncer(bus, weights, target, run=run, policy=policy, worker=worker,
                              out=out)
        followers.append(WeightFollower(syncer, engine=engine, poll_interval=poll_interval))
    return followers


def build_engines(rc: RolloutConfig, *, policies: Sequence[str],
                  models: Mapping[str, ModelConfig], out: str | Path = ".") -> dict[str, Engine]:
    """One engine per hosted policy (``rc.policies``, default: every policy of the run,
    ``policies``); a policy's model is ``rc.engine.model`` or else its ``models`` section
    (the defaults when ``models`` does not name it)."""
    hosted = rc.policies or list(policies)
    unknown = [p for p in hosted if p not in policies]
    if unknown:
        raise ConfigError(f"rollout.policies: {unknown} are not policies of this run "
                          f"({list(policies)})")
    ec = rc.engine

    def model_path(policy: str) -> Path:
        return (resolve(expand(ec.model, out=out, policy=policy), key="rollout.engine.model")
                if ec.model else model_dir(models.get(policy) or ModelConfig(), policy, out))

    def engine_kwargs(policy: str) -> dict[str, Any]:
        kwargs = ec.model_dump(exclude={"type", "model", "speed", "adapters", *SAMPLING_KEYS})
        kwargs["checkpoint_dir"] = expand(ec.checkpoint_dir, out=out, policy=policy)
        return kwargs

    engines: dict[str, Engine] = {}
    shared = [p for p in ec.adapters if p in hosted]  # one engine, a LoRA slot each
    if shared:
        paths = {p: Path(model_path(p)).resolve() for p in shared}
        if len(set(paths.values())) > 1:
            raise ConfigError(f"rollout.engine.adapters: the policies' models differ "
                              f"({', '.join(f'{p}: {m}' for p, m in paths.items())}); the "
                              "adapters of one engine share its base model")
        if ec.type != "hf":
            raise ConfigError("rollout.engine.adapters needs rollout.engine.type: hf")
        from astraflow.consumers.rollout.engines.adapters import adapter_views

        base = build_engine(ec.type, model_path=paths[shared[0]], adapters=shared,
                            **engine_kwargs(shared[0]))
        engines.update(adapter_views(base, shared))
    for policy in hosted:
        if policy in engines:
            continue
        engines[policy] = build_engine(ec.type, model_path=model_path(policy),
                                       **engine_kwargs(policy))
    return {p: engines[p] for p in hosted}


def build_worker(rc: RolloutConfig, *, run: str, policies: Sequence[str],
                 models: Mapping[str, ModelConfig], weights: WeightsConfig,
                 out: str | Path = ".", bus: Bus, engines: dict[str, Engine] | None = None,
                 worker_id: str | None = None, claims: BlobStore | None = None,
                 drain_max_staleness: int | Mapping[str, int] | None = None
                 ) -> RolloutWorker:
    """A :class:`RolloutWorker` of run ``run`` on ``bus`` (whose topics exist) as the
    ``rollout`` section ``rc`` describes, with weight followers when ``rc.weights.enabled``
    and the engines can take weights (their syncers are built from the ``weights`` section:
    store or fetch, cache dir, rate limit). ``engines`` default to :func:`build_engines`;
    either way they run at ``rc.engine.speed`` (:func:`~.engines.speed.slowed`).
    ``drain_max_staleness``: the run's staleness bounds (per policy), so that a draining
    worker releases the tasks its staleness filter would drop; None: it finishes all."""
    out = Path(out)
    worker_id = worker_id or component_id("rollout")
    configure(allow_same_uid=rc.sandbox.allow_same_uid)
    for module in rc.workflow.modules:
        importlib.import_module(module)
    for name, path in rc.tools.items():
        TOOLS.add(name, load_object(path, "tool"))
    engines = engines or build_engines(rc, policies=policies, models=models, out=out)
    engines = {p: slowed(e, rc.engine.speed) for p, e in engines.items()}
    runtime = Runtime.create(
        engines, reward=rc.reward.name, reward_kwargs=rc.reward.kwargs, extract=rc.reward.extract,
        reward_timeout=rc.reward.timeout, tool_timeout=rc.tool_timeout,
        sampling={k: getattr(rc.engine, k) for k in SAMPLING_KEYS},
        default_workflow=rc.workflow.default,
        workflow_kwargs=rc.workflow.kwargs, engine_latency=rc.engine.latency,
        allow_workflow_paths=rc.workflow.allow_task_paths, truncated=rc.reward.truncated)
    followers = (build_followers(engines, bus, weights, run=run, worker=worker_id, out=out,
                                 poll_interval=rc.weights.poll_interval)
                 if rc.weights.enabled else [])
    return RolloutWorker(
        bus, runtime, run=run, worker_id=worker_id, group=rc.group_for(run), claims=claims,
        max_concurrent_episodes=rc.max_concurrent_episodes, episode_timeout=rc.episode_timeout,
        session_timeout=rc.session_timeout, drain_timeout=rc.drain_timeout,
        poll_timeout=rc.poll_timeout, commit_interval=rc.commit_interval,
        metrics_interval=rc.metrics_interval, followers=followers,
        drain_max_staleness=drain_max_staleness)


def run_worker(rc: RolloutConfig, *, run: str, policies: Sequence[str],
               models: Mapping[str, ModelConfig], weights: WeightsConfig,
               out: str | Path = ".", bus: Bus, max_tasks: int | None = None,
               timeout: float | None = None, should_stop: Callable[[], bool] | None = None,
               worker_id: str | None = None,
               on_ready: Callable[[RolloutWorker], None] | None = None,
               claims: BlobStore | None = None,
               drain_max_staleness: int | Mapping[str, int] | None = None) -> WorkerStats:
    """Build the worker (:func:`build_worker`) and run it until stopped; closes its engines
    (the bus is the caller's)."""
    worker = build_worker(rc, run=run, policies=policies, models=models, weights=weights,
                          out=out, bus=bus, worker_id=worker_id, claims=claims,
                          drain_max_staleness=drain_max_staleness)
    try:
        if on_ready is not None:
            on_ready(worker)
        return worker.run(max_tasks=max_tasks, timeout=timeout, should_stop=should_stop)
    finally:
        for engine in worker.runtime.engines.values():
            engine.close()
