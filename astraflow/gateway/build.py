"""Building a gateway from the ``gateway`` section plus what it shares with the run and with
rollout workers: the engines (``rollout.engine``, one per served policy), the default
sampling, weight following (``rollout.weights`` and the ``weights`` section, through the same
:class:`~astraflow.consumers.rollout.weights.WeightFollower` a worker runs), the claim store.
What ``astraflow serve`` runs, through :mod:`astraflow.run.roles`."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.consumers.rollout.config import SAMPLING_KEYS, RolloutConfig
from astraflow.consumers.rollout.engines.base import Engine
from astraflow.core.errors import ConfigError
from astraflow.core.metrics import MetricsEmitter, component_id
from astraflow.gateway.config import GatewayConfig
from astraflow.gateway.service import Gateway
from astraflow.gateway.store import SessionStore

if TYPE_CHECKING:
    from astraflow.core.bus.types import Bus
    from astraflow.core.claims import BlobStore
    from astraflow.models.config import ModelConfig
    from astraflow.weights.config import WeightsConfig

log = logging.getLogger("astraflow.gateway")


def served_policies(gc: GatewayConfig, rc: RolloutConfig, policies: Sequence[str],
                    only: str | None = None) -> list[str]:
    """The policies the gateway serves: ``only`` (``--policy``), else ``gateway.policies``,
    else ``rollout.policies``, else every policy of the run."""
    served = [only] if only else (gc.policies or rc.policies or list(policies))
    unknown = [p for p in served if p not in policies]
    if unknown:
        raise ConfigError(f"gateway: {unknown} are not policies of this run "
                          f"({', '.join(policies)}); fix --policy or gateway.policies")
    return served


def build_gateway(gc: GatewayConfig, rc: RolloutConfig, *, run: str, policies: Sequence[str],
                  models: Mapping[str, ModelConfig], weights: WeightsConfig, bus: Bus,
                  out: str | Path = ".", only: str | None = None,
                  engines: Mapping[str, Engine] | None = None,
                  claims: BlobStore | None = None, follow_weights: bool | None = None,
                  component: str | None = None) -> Gateway:
    """A :class:`Gateway` of run ``run`` on ``bus`` (whose topics exist). ``engines`` default
    to rollout's :func:`~astraflow.consumers.rollout.service.build_engines` for the served
    policies; weights are followed when ``rollout.weights.enabled`` (``follow_weights``
    overrides) and an engine can take them."""
    served = served_policies(gc, rc, policies, only)
    if engines is None:
        from astraflow.consumers.rollout.service import build_engines

        engines = build_engines(rc.model_copy(update={"policies": served}), policies=policies,
                                models=models, out=out)
    else:
        engines = {p: engines[p] for p in served}
    component = component or component_id("gateway")
    metrics = MetricsEmitter(bus, run=run, role="gateway", component=component,
                             interval=gc.metrics_interval)
    followers = []
    if rc.weights.enabled if follow_weights is None else follow_weights:
        from astraflow.consumers.rollout.service import build_followers

        followers = [f.start() for f in build_followers(
            engines, bus, weights, run=run, worker=component, out=out,
            poll_interval=rc.weights.poll_interval)]
    store = SessionStore(bus, run=run, max_open_sessions=gc.max_open_sessions,
                         retry_after_s=gc.retry_after_s, claims=claims, worker_id=component,
                         metrics=metrics, idempotency_cache=gc.idempotency_cache,
                         idempotency_cache_bytes=gc.idempotency_cache_bytes,
                         idle_timeout_s=gc.session_idle_timeout_s,
                         max_open_per_owner=sessions_per_client(gc),
                         closed_retention_s=gc.closed_session_retention_s,
                         require_group=gc.require_group,
                         versions=lambda: {p: e.version for p, e in engines.items()})
    sampling: dict[str, Any] = {k: getattr(rc.engine, k) for k in SAMPLING_KEYS}
    return Gateway(engines, store, on_drift=gc.on_drift, aliases=gc.aliases, sampling=sampling,
                   max_inflight=gc.max_inflight, max_n=gc.max_n, context_length=gc.context_length,
                   tools_prompt=gc.tools_prompt, tool_result_format=gc.tool_result_format,
                   followers=followers, metrics=metrics,
                   template_cache_bytes=gc.template_cache_bytes)


def sessions_per_client(gc: GatewayConfig) -> int:
    """``gateway.max_open_sessions_per_client``, or by default ``max_open_sessions`` shared
    evenly among the clients of ``gateway.keys`` (all of it with none or one)."""
    if gc.max_open_sessions_per_client is not None:
        return gc.max_open_sessions_per_client
    return max(1, -(-gc.max_open_sessions // max(1, len(gc.keys))))
