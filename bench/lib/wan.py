"""An emulated WAN on one machine: Toxiproxy (Shopify's TCP proxy) in front of the Kafka
broker and the weight server, one proxy per region, each with a :class:`Link` (round-trip
time, jitter, bandwidth) and cuts on demand (docs/wan.md).

>>> with Toxiproxy() as tp:
...     region = tp.proxy("region-b", upstream="127.0.0.1:8000", link=Link(rtt_ms=300))
...     HttpStore(f"http://{region.listen}")       # every byte now crosses a 300 ms link
...     region.cut()                                # open connections drop, new ones too
...     region.restore()

The server is ``toxiproxy-server`` (built by ``scripts/install-toxiproxy.sh``), run as a child
process with its HTTP API on a free local port; this module talks to that API with urllib.
Standard library only (and core's small helpers).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

from astraflow.core.broker.jars import cache_dir, tail_text
from astraflow.core.errors import AstraflowError
from astraflow.core.ports import free_port

log = logging.getLogger(__name__)

BINARY = "toxiproxy-server"
ENV = "ASTRAFLOW_TOXIPROXY"
INSTALL_HINT = (f"install Toxiproxy with scripts/install-toxiproxy.sh (builds {BINARY} with Go "
                f"into ~/.cache/astraflow/bin), or put {BINARY} on PATH, or set {ENV}=/path/to/it")
STREAMS = ("upstream", "downstream")  # client -> server, server -> client
LINK_PREFIX = "link_"  # the toxics apply_link owns on a proxy
CUT = "cut"  # the toxic of Proxy.cut


class WanError(AstraflowError):
    """Toxiproxy is missing, did not start, or its API refused a request (status and body)."""


def find_toxiproxy() -> str | None:
    """The ``toxiproxy-server`` to run: ``$ASTRAFLOW_TOXIPROXY``, else one on PATH, else the one
    ``scripts/install-toxiproxy.sh`` built in the cache; None when there is none."""
    env = os.environ.get(ENV)
    if env:
        return env if os.access(env, os.X_OK) else None
    found = shutil.which(BINARY)
    if found:
        return found
    cached = cache_dir() / "bin" / BINARY
    return str(cached) if os.access(cached, os.X_OK) else None


@dataclass(frozen=True)
class Link:
    """The network between two regions, as :func:`apply_link` lays it on a proxy.

    ``rtt_ms``: the round trip added (half on each direction). ``jitter_ms``: each direction
    varies by up to ± ``jitter_ms / 2``, so a round trip by up to ± ``jitter_ms``.
    ``bandwidth_bytes_per_s``: the cap in each direction, per TCP connection (Toxiproxy limits
    every connection on its own, not their sum); None: no cap.
    """

    rtt_ms: float = 0.0
    jitter_ms: float = 0.0
    bandwidth_bytes_per_s: int | None = None

    def __post_init__(self) -> None:
        if self.rtt_ms < 0 or self.jitter_ms < 0:
            raise WanError(f"a link's rtt_ms and jitter_ms must be >= 0, got {self}")
        if self.jitter_ms > self.rtt_ms:
            raise WanError(f"a link's jitter_ms ({self.jitter_ms}) must not exceed its rtt_ms "
                           f"({self.rtt_ms}): a delay cannot go below zero")
        if self.bandwidth_bytes_per_s is not None and self.bandwidth_bytes_per_s < 1000:
            raise WanError(f"a link's bandwidth_bytes_per_s must be >= 1000 (Toxiproxy's unit "
                           f"is 1 KB/s), got {self.bandwidth_bytes_per_s}")


def link_toxics(link: Link) -> list[dict[str, Any]]:
    """The Toxiproxy toxics that make ``link``, one set per direction.

    Toxiproxy's ``bandwidth`` rate is in KB/s with KB = 1000 bytes (it sleeps ``len / rate``
    milliseconds per chunk), so the rate is ``bandwidth_bytes_per_s / 1000``, rounded.
    ``latency`` and ``jitter`` are whole milliseconds.
    """
    toxics = []
    for stream in STREAMS:
        if link.rtt_ms > 0:
            toxics.append({"name": f"{LINK_PREFIX}latency_{stream}", "type": "latency",
                           "stream": stream, "toxicity": 1.0,
                           "attributes": {"latency": round(link.rtt_ms / 2),
                                          "jitter": round(link.jitter_ms / 2)}})
        if link.bandwidth_bytes_per_s is not None:
            toxics.append({"name": f"{LINK_PREFIX}bandwidth_{stream}", "type": "bandwidth",
                           "stream": stream, "toxicity": 1.0,
                           "attributes": {"rate": round(link.bandwidth_bytes_per_s / 1000)}})
    return toxics


def apply_link(proxy: Proxy, link: Link) -> None:
    """Make ``proxy`` behave like ``link`` (replacing the link it had; ``Link()`` removes it).
    Toxics added by hand (cuts, resets) stay."""
    for toxic in proxy.toxics():
        if str(toxic.get("name", "")).startswith(LINK_PREFIX):
            proxy.remove_toxic(toxic["name"])
    for toxic in link_toxics(link):
        proxy.add_toxic(toxic["type"], stream=toxic["stream"], name=toxic["name"],
                        **toxic["attributes"])


class _Api:
    """A JSON client of Toxiproxy's HTTP API."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace").strip()
            e.close()
            raise WanError(f"Toxiproxy refused {method} {path}: HTTP {e.code} {detail}"
                           + (f" (request: {json.dumps(body)})" if body is not None else "")
                           ) from None
        except (urllib.error.URLError, OSError) as e:
            raise WanError(f"Toxiproxy at {self.url} did not answer {method} {path}: {e}"
                           ) from None
        return json.loads(text) if text.strip() else None


class Proxy:
    """One proxy of a :class:`Toxiproxy` server: TCP connections to ``listen`` are forwarded to
    ``upstream`` through its toxics. Made by :meth:`Toxiproxy.proxy`."""

    def __init__(self, api: _Api, name: str, listen: str, upstream: str) -> None:
        self._api = api
        self.name = name
        self.listen = listen  # "host:port" with the port Toxiproxy bound
        self.upstream = upstream

    def __repr__(self) -> str:
        return f"Proxy({self.name!r}, listen={self.listen!r}, upstream={self.upstream!r})"

    @property
    def _path(self) -> str:
        return f"/proxies/{quote(self.name, safe='')}"

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def add_toxic(self, kind: str, *, stream: str = "downstream", name: str | None = None,
                  toxicity: float = 1.0, **attributes: Any) -> str:
        """Add a toxic of type ``kind`` (``latency``, ``bandwidth``, ``timeout``, ``reset_peer``,
        ``slicer``, ``limit_data``, ``slow_close``; attributes as in Toxiproxy's README) to one
        direction: ``upstream`` is client -> server, ``downstream`` server -> client. It applies
        to open connections too. Returns its name (default ``<kind>_<stream>``)."""
        if stream not in STREAMS:
            raise WanError(f"unknown stream {stream!r} for toxic {kind!r} on proxy "
                           f"{self.name!r}; valid: upstream (client -> server), downstream "
                           "(server -> client)")
        body = {"type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes,
                "name": name or f"{kind}_{stream}"}
        created = self._api.call("POST", f"{self._path}/toxics", body)
        return str(created["name"])

    def remove_toxic(self, name: str) -> None:
        self._api.call("DELETE", f"{self._path}/toxics/{quote(name, safe='')}")

    def toxics(self) -> list[dict[str, Any]]:
        return list(self._api.call("GET", f"{self._path}/toxics") or [])

    def apply(self, link: Link) -> None:
        """:func:`apply_link` on this proxy."""
        apply_link(self, link)

    def cut(self) -> None:
        """Cut the link: every open connection is closed at once and new ones are accepted and
        closed (a ``reset_peer`` toxic), as across a dead route, until :meth:`restore`. Clients
        see an early end of stream or a reset. Safe to change toxics afterwards."""
        self.add_toxic("reset_peer", stream="downstream", name=CUT, timeout=0)

    def restore(self) -> None:
        """Undo :meth:`cut` (the link's latency and bandwidth stay as they were)."""
        self.remove_toxic(CUT)

    def disable(self) -> None:
        """Take the proxy down: it stops listening (connecting is refused) and drops every open
        connection, until :meth:`enable`.

        Toxiproxy 2.12 can deadlock when a toxic is removed right after this dropped a
        connection with data still inside its toxics (a latency or bandwidth toxic blocks on a
        writer that is gone while the removal holds the proxy's lock): the API then stops
        answering. Use :meth:`cut` when the link's toxics may change after the cut."""
        self._api.call("PATCH", self._path, {"enabled": False})

    def enable(self) -> None:
        """Bring a disabled proxy back, on the same listen address."""
        self._api.call("PATCH", self._path, {"enabled": True})

    def reset(self) -> None:
        """Remove every toxic, the link's included, and enable the proxy."""
        for toxic in self.toxics():
            self.remove_toxic(toxic["name"])
        self.enable()

    def delete(self) -> None:
        self._api.call("DELETE", self._path)


class Toxiproxy:
    """A ``toxiproxy-server`` child process and a client of its API, for a block::

        with Toxiproxy() as tp:
            p = tp.proxy("kafka-b", upstream="127.0.0.1:9094", listen="127.0.0.1:29094")

    ``binary`` defaults to :func:`find_toxiproxy`; ``port`` (its API) to a free one. The
    server's log goes to a temporary file, quoted when it fails to start.
    """

    def __init__(self, binary: str | None = None, *, host: str = "127.0.0.1",
                 port: int | None = None, start_timeout: float = 15.0) -> None:
        self.binary = binary
        self.host = host
        self.port = port
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None
        self._api: _Api | None = None

    @property
    def api(self) -> _Api:
        if self._api is None:
            raise WanError("Toxiproxy is not running; use it as `with Toxiproxy() as tp:` or "
                           "call start()")
        return self._api

    @property
    def url(self) -> str:
        """The server's HTTP API, ``http://host:port``."""
        return self.api.url

    def start(self) -> None:
        """Start the server and return once its API answers."""
        if self._proc is not None:
            return
        binary = self.binary or find_toxiproxy()
        if binary is None:
            env = os.environ.get(ENV)
            where = f"{ENV}={env} is not an executable file" if env else f"{BINARY} not found"
            raise WanError(f"{where}; {INSTALL_HINT}")
        if not os.access(binary, os.X_OK):
            raise WanError(f"{binary} is not an executable file; {INSTALL_HINT}")
        for attempt in range(3):  # a free port can be taken before the server binds it
            port = self.port or free_port()
            self._launch(binary, port)
            try:
                self._wait_ready()
            except WanError:
                exited = self._proc is not None and self._proc.poll() is not None
                self.stop()
                if exited and self.port is None and attempt < 2:
                    continue
                raise
            log.info("toxiproxy started pid=%d api=%s", self._proc_pid(), self.url)
            return

    def _proc_pid(self) -> int:
        return self._proc.pid if self._proc is not None else -1

    def _launch(self, binary: str, port: int) -> None:
        fd, name = tempfile.mkstemp(prefix="toxiproxy-", suffix=".log")
        os.close(fd)
        self._log = Path(name)
        env = {**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "warn")}
        with open(self._log, "wb") as out:
            self._proc = subprocess.Popen([binary, "-host", self.host, "-port", str(port)],
                                          stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, env=env)
        self._api = _Api(f"http://{self.host}:{port}")

    def _output(self) -> str:
        if self._log is None:
            return ""
        return tail_text(self._log.read_text(errors="replace"), 20)

    def _wait_ready(self) -> None:
        assert self._proc is not None and self._api is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise WanError(f"{BINARY} exited with code {code} while starting:\n"
                               f"{self._output() or '(no output)'}")
            try:
                self._api.call("GET", "/version")
                return
            except WanError:
                if time.monotonic() > deadline:
                    raise WanError(f"{BINARY} did not answer on {self._api.url} within "
                                   f"{self.start_timeout:.0f}s:\n{self._output()}") from None
                time.sleep(0.05)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the server (then kill it after ``timeout``); every proxy goes with it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("toxiproxy pid=%d ignored SIGTERM for %.0fs; killing it",
                            proc.pid, timeout)
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None
        self._api = None

    def __enter__(self) -> Toxiproxy:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- the API

    def version(self) -> str:
        return str(self.api.call("GET", "/version")["version"])

    def proxy(self, name: str, upstream: str, *, listen: str = "127.0.0.1:0",
              link: Link | None = None, enabled: bool = True) -> Proxy:
        """Create proxy ``name`` from ``listen`` (port 0: Toxiproxy picks one; read it from the
        result's ``listen``) to ``upstream`` (``host:port``), with ``link`` applied if given."""
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}
        created = self.api.call("POST", "/proxies", body)
        proxy = Proxy(self.api, name, str(created["listen"]), str(created["upstream"]))
        if link is not None:
            apply_link(proxy, link)
        log.info("proxy %s listen=%s upstream=%s link=%s", name, proxy.listen, upstream, link)
        return proxy

    def proxies(self) -> dict[str, Proxy]:
        return {name: Proxy(self.api, name, str(p["listen"]), str(p["upstream"]))
                for name, p in (self.api.call("GET", "/proxies") or {}).items()}

    def reset(self) -> None:
        """Enable every proxy and remove every toxic (links included)."""
        self.api.call("POST", "/reset")
