"""Serving the app with uvicorn: in the foreground (``astraflow serve``) or on a thread (tests,
benchmarks, a rollout worker that drives an external agent through the gateway).

>>> with ServerThread(create_app(gateway), port=0) as srv:
...     client = openai.OpenAI(base_url=f"{srv.url}/sessions/ep-1/v1", api_key="-")
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

from astraflow.core.errors import AstraflowError
from astraflow.gateway.errors import GatewayError
from astraflow.gateway.limits import Limits

INSTALL_HINT = "pip install 'astraflow[gateway]'"


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ImportError as e:  # an optional dependency
        raise AstraflowError(f"the gateway needs {e.name}: {INSTALL_HINT}") from None
    return uvicorn


def app_for(gateway: Any, *, token: str | None = None, limits: Limits | None = None) -> Any:
    """The ASGI app of ``gateway`` (:func:`astraflow.gateway.app.create_app`; ``token``: the
    bearer token it requires; ``limits``: what one request may cost), or an error that says
    how to install FastAPI."""
    try:
        from astraflow.gateway.app import create_app
    except ImportError as e:  # an optional dependency
        raise AstraflowError(f"the gateway needs {e.name}: {INSTALL_HINT}") from None
    return create_app(gateway, token=token, limits=limits)


def server_for(app: Any, *, host: str, port: int, log_level: str = "warning",
               limits: Limits | None = None, **options: Any) -> Any:
    """A uvicorn server of ``app`` that holds connections within ``limits``
    (:mod:`astraflow.gateway.connections`: header and idle deadlines, header size, a
    connection cap below the file-descriptor limit and one per peer address)."""
    from astraflow.gateway.connections import RateLimitedLog, connection_cap, guarded_protocol
    from astraflow.gateway.guards import HeadLimit

    uvicorn = _uvicorn()
    limits = limits or Limits()
    said = RateLimitedLog()
    config = uvicorn.Config(
        HeadLimit(app, limits.max_header_bytes), host=host, port=port, log_level=log_level,
        http=guarded_protocol(limits, connection_cap(limits), said),
        timeout_keep_alive=limits.idle_timeout_s,
        h11_max_incomplete_event_size=limits.max_header_bytes, **options)
    server = uvicorn.Server(config)
    server.said = said
    return server


async def _serve(server: Any) -> None:
    from astraflow.gateway.connections import quiet_accept_errors

    quiet_accept_errors(asyncio.get_running_loop(), server.said)
    await server.serve()


def run_server(server: Any) -> None:
    """Run a :func:`server_for` server until it exits, on a new asyncio loop that stays
    quiet out of file descriptors (:class:`~astraflow.gateway.connections.GuardedLoop`;
    uvloop, where installed, is not used)."""
    from astraflow.gateway.connections import GuardedLoop

    with asyncio.Runner(loop_factory=GuardedLoop) as runner:
        runner.run(_serve(server))


def serve(app: Any, *, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "warning", limits: Limits | None = None) -> None:
    """Serve ``app`` until SIGINT/SIGTERM (uvicorn's own handlers: in-flight requests finish,
    then the lifespan closes the gateway)."""
    run_server(server_for(app, host=host, port=port, log_level=log_level, limits=limits,
                          timeout_graceful_shutdown=30))


class ServerThread:
    """``app`` served on a daemon thread; ``port=0`` takes a free port. A context manager:
    started on entry (after the app's startup ran), stopped on exit."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", limits: Limits | None = None) -> None:
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
        self.host, self.port = host, port
        self.server = server_for(app, host=host, port=port, log_level=log_level,
                                 limits=limits, lifespan="on")
        self._thread = threading.Thread(target=run_server, args=(self.server,), daemon=True,
                                        name=f"af-gateway-{port}")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise GatewayError(500, f"the gateway on port {self.port} did not start")
            if time.monotonic() > deadline:
                raise GatewayError(500, f"the gateway on port {self.port} did not start in "
                                        f"{timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
