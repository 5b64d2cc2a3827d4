"""The gateway of one rollout worker, inside it: what the ``openai_agent`` workflow points a
user's OpenAI-SDK agent at (docs/gateway.md, "Train your own agent with astraflow run").

One per :class:`~astraflow.consumers.rollout.runtime.Runtime` and set of options, started by
the first episode that needs it: a :class:`~astraflow.gateway.service.Gateway` whose
generations go through the runtime's own batchers, its sessions in memory, served by uvicorn
on a thread of its own at 127.0.0.1, behind a bearer token of its own
(:attr:`LocalGateway.token`, the agents' ``api_key``). It stops on :meth:`LocalGateway.stop`,
or when its runtime is garbage collected or its worker's event loop has closed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic

from astraflow.consumers.rollout.engines.base import GenRequest, GenResult
from astraflow.core.errors import ConfigError
from astraflow.gateway.config import GatewayConfig
from astraflow.gateway.limits import Limits
from astraflow.gateway.service import Gateway
from astraflow.gateway.session import Session
from astraflow.gateway.store import SessionStore

if TYPE_CHECKING:
    from astraflow.consumers.rollout.batcher import Batcher
    from astraflow.consumers.rollout.runtime import Runtime
    from astraflow.gateway.server import ServerThread

log = logging.getLogger("astraflow.gateway.local")

T = TypeVar("T")
#: the ``gateway`` section's keys that apply to a worker's gateway (the rest are about serving
#: a run: host, port, capacity, weights; the worker has its own)
OPTIONS = ("aliases", "on_drift", "max_n", "context_length", "tools_prompt",
           "tool_result_format")
#: threads for synchronous agents (made as episodes need them; the worker's
#: max_concurrent_episodes bounds how many run)
AGENT_THREADS = 1024
UNBOUNDED = 1 << 30  # the worker bounds sessions and generations, not the gateway


def local_limits() -> Limits:
    """The request limits of a worker's gateway: those of ``astraflow serve`` guard against
    clients the gateway does not know; here every client is an episode of the worker (behind
    its token, on loopback), their number bounded by ``max_concurrent_episodes``, and their SDK
    clients do not retry. So the tokenizer's queue and the connection count are unbounded (the
    file-descriptor reserve still holds; every episode connects from 127.0.0.1, so there is no
    cap per peer), and a header may take as long as a loaded worker
    needs to serve it."""
    return Limits(max_tokenize_waiting=UNBOUNDED, max_connections=UNBOUNDED,
                  max_connections_per_peer=UNBOUNDED, header_timeout_s=300.0)


def bridge(batchers: Mapping[str, Batcher], loop: asyncio.AbstractEventLoop
           ) -> Callable[[str, GenRequest], Awaitable[GenResult]]:
    """``generate(policy, request)`` for a gateway on another event loop: the request joins
    ``batchers[policy]`` on ``loop`` (a cancelled call cancels it there)."""
    async def generate(policy: str, request: GenRequest) -> GenResult:
        fut = asyncio.run_coroutine_threadsafe(batchers[policy].generate(request), loop)
        return await asyncio.wrap_future(fut)
    return generate


def gateway_options(options: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """The Gateway keyword arguments of ``options`` (keys of the ``gateway`` section named in
    :data:`OPTIONS`), checked as the section checks them (once per distinct ``options``)."""
    raw = json.dumps(dict(options or {}), sort_keys=True)
    kwargs = _CHECKED.get(raw)
    if kwargs is None:
        unknown = sorted(set(options or {}) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; valid: "
                              f"{', '.join(OPTIONS)}")
        try:
            cfg = GatewayConfig.model_validate(dict(options or {}))
        except pydantic.ValidationError as e:
            raise ConfigError([f"{where}.{'.'.join(map(str, err['loc']))}: {err['msg']}"
                               for err in e.errors()]) from None
        kwargs = _CHECKED[raw] = {k: getattr(cfg, k) for k in OPTIONS}
    return dict(kwargs)


_CHECKED: dict[str, dict[str, Any]] = {}  # options as JSON -> their Gateway kwargs


class LocalGateway:
    """A started in-process gateway (see the module docstring); make one with :meth:`of`."""

    def __init__(self, gw: Gateway, server: ServerThread, loop: asyncio.AbstractEventLoop,
                 token: str) -> None:
        self.gw = gw
        self.server = server
        self.token = token
        self.loop = loop  # the worker's
        self.url = server.url
        self.pool = ThreadPoolExecutor(AGENT_THREADS, thread_name_prefix="af-agent")

    @classmethod
    async def of(cls, runtime: Runtime, options: Mapping[str, Any] | None = None
                 ) -> LocalGateway:
        """The gateway of ``runtime`` with ``options`` (:func:`gateway_options`), started on
        first use (concurrent first uses wait for the one start)."""
        kwargs = gateway_options(options, "rollout.workflow.kwargs.openai_agent.gateway")
        key = (id(runtime), json.dumps(kwargs, sort_keys=True))
        entry = _RUNNING.get(key)
        if entry is None:
            _reap()
            entry = _RUNNING[key] = asyncio.ensure_future(_start(runtime, kwargs))
            entry.add_done_callback(functools.partial(_drop_unstarted, key))
            weakref.finalize(runtime, _forget, key)
        return await asyncio.shield(entry)

    def base_url(self, sid: str) -> str:
        """The OpenAI base URL of session ``sid``."""
        return f"{self.url}/sessions/{sid}/v1"

    async def _on_gateway(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self.gw.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.gw.loop))

    async def open(self, sid: str, meta: Mapping[str, Any],
                   sampling: Mapping[str, Any] | None = None) -> str:
        """Open a new session (``sid``, or ``sid.rN`` if that one is taken: a task redelivered
        while its first run is still here) with its metadata and sampling defaults; its id."""
        async def run() -> str:
            store, n = self.gw.store, 0
            name = sid
            while name in store.sessions or name in store.closed:
                n += 1
                name = f"{sid}.r{n}"
            await store.open(name, meta)
            if sampling:
                self.gw.session_sampling[name] = dict(sampling)
            return name
        return await self._on_gateway(run())

    async def take(self, sid: str) -> Session:
        """Close ``sid`` (a call still running is refused: 409) and hand over its session."""
        async def run() -> Session:
            self.gw.session_sampling.pop(sid, None)
            return await self.gw.store.take(sid)
        return await self._on_gateway(run())

    def stop(self) -> None:
        """Stop serving (returns at once; uvicorn then closes the gateway)."""
        self.server.server.should_exit = True
        self.pool.shutdown(wait=False, cancel_futures=True)


#: (id(runtime), options) -> the gateway (a task while it starts)
_RUNNING: dict[tuple[int, str], asyncio.Future[LocalGateway]] = {}


async def _start(runtime: Runtime, kwargs: dict[str, Any]) -> LocalGateway:
    from astraflow.gateway.server import ServerThread, app_for

    loop = asyncio.get_running_loop()
    store = SessionStore(None, max_open_sessions=UNBOUNDED)
    gw = Gateway(runtime.engines, store, sampling=runtime.sampling, max_inflight=UNBOUNDED,
                 generate=bridge(runtime.batchers, loop), **kwargs)
    token, limits = secrets.token_urlsafe(32), local_limits()
    server = await asyncio.to_thread(
        lambda: ServerThread(app_for(gw, token=token, limits=limits), limits=limits).start())
    log.info("agent gateway serving policies=%s at %s", ",".join(gw.policies), server.url)
    return LocalGateway(gw, server, loop, token)


def _drop_unstarted(key: tuple[int, str], entry: asyncio.Future[LocalGateway]) -> None:
    """Forget a start that failed (the next episode tries again) or was cancelled (its worker's
    loop closed while it started): its traceback holds the runtime, whose finalizer would then
    never run."""
    if (entry.cancelled() or entry.exception() is not None) and _RUNNING.get(key) is entry:
        del _RUNNING[key]


def _stop(entry: asyncio.Future[LocalGateway]) -> None:
    if entry.done() and not entry.cancelled() and entry.exception() is None:
        entry.result().stop()


def _forget(key: tuple[int, str]) -> None:
    entry = _RUNNING.pop(key, None)
    if entry is not None:
        _stop(entry)


def _reap() -> None:
    """Stop the gateways whose worker's event loop has closed (an evaluation's)."""
    for key, entry in list(_RUNNING.items()):
        if entry.done() and not entry.cancelled() and entry.exception() is None \
                and entry.result().loop.is_closed():
            _forget(key)
