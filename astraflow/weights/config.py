"""Config section ``weights``: serving dtype, full-snapshot interval, codec level, the weight
store the trainer writes and the one workers read, and the syncer's cache and rate limit.

    weights:
      full_every: 20
      store: {type: file, path: "{out}/weights"}                 # the trainer writes here
      fetch: {type: http, url: "http://trainer:8470", token: s3cret}   # workers read here

``{out}`` is the run directory. Without ``fetch`` workers read ``store`` (a shared mount, or the
same host). This module imports nothing heavy; the ``build_*`` factories import the weights
package when called.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic

from astraflow.core.config import Section
from astraflow.core.paths import expand
from astraflow.core.registry import Registry

if TYPE_CHECKING:
    from astraflow.core.bus import Bus
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.sharded import ShardedPublisher
    from astraflow.weights.store import WeightStore
    from astraflow.weights.syncer import Syncer


class StoreConfig(Section):
    """A weight store: ``file`` (a directory, local or a shared mount) or ``http`` (a server
    started with ``astraflow weights serve DIR``)."""

    type: Literal["file", "http"] = "file"
    path: str = pydantic.Field(default="{out}/weights",
                               description="file: the blob directory")
    url: str = pydantic.Field(default="", description="http: base URL of the weight server")
    token: str | None = pydantic.Field(
        default=None, description="http: bearer token (default: $ASTRAFLOW_WEIGHTS_TOKEN)")

    @pydantic.model_validator(mode="after")
    def _url_for_http(self) -> StoreConfig:
        if self.type == "http" and not self.url.startswith(("http://", "https://")):
            raise ValueError("an http store needs url: http(s)://host:port")
        return self


class ServerConfig(Section):
    """Limits of a weight server: what any client, with the token or not, can hold of it.
    ``astraflow weights mirror`` serves with these (``weights serve`` takes them as options)."""

    max_connections: int = pydantic.Field(
        default=256, ge=1,
        description="authenticated connections served at once (lowered to what `ulimit -n` "
                    "allows); one more is answered 503 and closed")
    idle_timeout_s: float = pydantic.Field(
        default=30.0, gt=0,
        description="a connection must send each request head whole within this long, and is "
                    "closed after this long without reading or writing")
    max_unauthenticated: int = pydantic.Field(
        default=64, ge=1,
        description="connections waiting to send their first request with the token (they "
                    "hold no slot of max_connections); one more closes the oldest of them")
    auth_timeout_s: float = pydantic.Field(
        default=5.0, gt=0,
        description="a new connection must send its first request head whole within this "
                    "long, or is closed")


class WeightsConfig(Section):
    """Weight publishing and sync (docs/weights.md)."""

    dtype: Literal["bfloat16", "float16", "float32"] | None = pydantic.Field(
        default="bfloat16",
        description="serving dtype the trainer's tensors are cast to; null: as they are")
    full_every: int = pydantic.Field(default=20, ge=1,
                                     description="a full snapshot every K versions")
    refresh_full_after_s: float | None = pydantic.Field(
        default=60.0, gt=0,
        description="with no new version for this long, or three times the pace of versions if "
        "longer (a starved trainer), publish the newest again as a full snapshot, once: workers "
        "that cannot build it (a delta blob corrupt or gone) can then; null: never")
    max_delta_fraction: float = pydantic.Field(
        default=0.5, gt=0, le=1,
        description="a delta larger than this fraction of dense is replaced by a full")
    zstd_level: int = pydantic.Field(default=1, ge=-7, le=22, description="1 measured best")
    store: StoreConfig = StoreConfig()
    fetch: StoreConfig | None = pydantic.Field(
        default=None, description="where workers read blobs (e.g. a regional mirror); "
                                  "absent: store")
    fallback: StoreConfig | None = pydantic.Field(
        default=None, description="where a worker fetches a blob again when `fetch` lacks it "
                                  "or serves it corrupt (the trainer's store behind a mirror);"
                                  " absent: no second source")
    fallback_grace_s: float = pydantic.Field(
        default=60.0, ge=0,
        description="a blob `fetch` lacks is waited for this long after its manifest was "
                    "written (a mirror still fetching it) before it is fetched from `fallback`")
    cache_dir: str = pydantic.Field(default="{out}/weights-cache/{worker}",
                                    description="workers' download directory")
    rate_limit: float | None = pydantic.Field(
        default=None, gt=0,
        description="bytes/s cap on a worker's downloads (emulates a slow link)")
    download_deadline_s: float = pydantic.Field(
        default=60.0, gt=0,
        description="a blob download may take this long plus its size at download_min_rate "
                    "(or rate_limit, when lower); past it, it stops and resumes at the next sync")
    download_min_rate: float = pydantic.Field(
        default=1_000_000.0, gt=0,
        description="bytes/s below which a download is given up at its deadline (a store "
                    "dripping bytes cannot hold a worker)")
    server: ServerConfig = ServerConfig()


def _file_store(cfg: StoreConfig, out: str | Path) -> WeightStore:
    from astraflow.weights.store import FileStore

    return FileStore(expand(cfg.path, out=out))


def _http_store(cfg: StoreConfig, out: str | Path) -> WeightStore:
    from astraflow.weights.http import HttpStore

    return HttpStore(cfg.url, token=cfg.token or os.environ.get("ASTRAFLOW_WEIGHTS_TOKEN"))


#: store ``type`` -> factory (the config's ``type`` is one of these: no plug-ins here, a
#: store is read by every worker and its format is the trainer's)
STORES: Registry[Callable[[StoreConfig, str | Path], WeightStore]] = Registry("weight store")
STORES.add("file", _file_store)
STORES.add("http", _http_store)


def build_store(cfg: StoreConfig, out: str | Path = ".") -> WeightStore:
    """The weight store a :class:`StoreConfig` describes."""
    return STORES.resolve(cfg.type)(cfg, out)


def build_publisher(bus: Bus, cfg: WeightsConfig, *, run: str, policy: str,
                    out: str | Path = ".") -> Publisher:
    """The trainer's publisher for ``policy``."""
    from astraflow.weights.publisher import Publisher

    return Publisher(bus, run=run, policy=policy, store=build_store(cfg.store, out),
                     full_every=cfg.full_every, max_delta_fraction=cfg.max_delta_fraction,
                     dtype=cfg.dtype, level=cfg.zstd_level,
                     refresh_full_after_s=cfg.refresh_full_after_s)


def build_sharded_publisher(bus: Bus | None, cfg: WeightsConfig, *, run: str, policy: str,
                            rank: int, world_size: int, out: str | Path = ".",
                            group: Any = None) -> ShardedPublisher:
    """A sharded trainer's publisher on rank ``rank`` (every rank has one; rank 0's, given the
    bus, sends the manifests): each publishes the rows it owns (docs/weights.md, "Publishing
    from the shards"). ``group``: the torch.distributed process group (None: the default)."""
    from astraflow.weights.sharded import ShardedPublisher, torch_exchange

    return ShardedPublisher(bus if rank == 0 else None, run=run, policy=policy,
                            store=build_store(cfg.store, out), rank=rank,
                            world_size=world_size, exchange=torch_exchange(group),
                            full_every=cfg.full_every,
                            max_delta_fraction=cfg.max_delta_fraction, dtype=cfg.dtype,
                            level=cfg.zstd_level)


def build_syncer(bus: Bus, cfg: WeightsConfig, target: Any, *, run: str, policy: str,
                 worker: str, out: str | Path = ".") -> Syncer:
    """A rollout worker's syncer for ``policy`` into ``target`` (a WeightTarget)."""
    from astraflow.weights.syncer import Syncer

    cache_dir = expand(cfg.cache_dir, out=out, worker=f"{worker}/{policy}")
    fallback = build_store(cfg.fallback, out) if cfg.fallback is not None else None
    return Syncer(bus, run=run, policy=policy, store=build_store(cfg.fetch or cfg.store, out),
                  target=target, cache_dir=cache_dir, rate_limit=cfg.rate_limit,
                  fallback=fallback, fallback_grace_s=cfg.fallback_grace_s,
                  deadline_s=cfg.download_deadline_s, min_rate=cfg.download_min_rate)
