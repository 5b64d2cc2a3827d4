"""Connections a client cannot keep: a fresh one that sends nothing, headers sent a byte at a
time, a connection idle after its answer are all closed; connections past the cap are closed at
once; and ``astraflow serve`` at its file-descriptor limit, flooded with unfinished requests,
refuses quietly and serves legitimate requests once the flood is gone."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from astraflow.core.ports import free_port
from astraflow.gateway.connections import RateLimitedLog, quiet_accept_errors
from astraflow.gateway.limits import Limits

HANG_GUARD = 30.0  # seconds; only a hang ever waits this long
USER = [{"role": "user", "content": "Hello"}]


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=HANG_GUARD)


def _closed_by_server(s: socket.socket, drip: bytes = b"") -> bool:
    """Whether the server closes ``s`` (within the hang guard) while the test sends ``drip``
    a byte at a time (never a whole request head)."""
    deadline = time.monotonic() + HANG_GUARD
    s.settimeout(0.1)
    i = 0
    while time.monotonic() < deadline:
        try:
            if i < len(drip):
                s.sendall(drip[i:i + 1])
                i += 1
            if s.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


@pytest.fixture
def gateway(serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> Any:
    def make(limits: Limits) -> Any:
        return serve(rule_engine(ascii_tokenizer, lambda p: "ok"), limits=limits)
    return make


def test_slow_or_silent_clients_are_closed(gateway: Any) -> None:
    served = gateway(Limits(header_timeout_s=0.5, idle_timeout_s=0.5))
    with _connect(served.url) as silent:
        assert _closed_by_server(silent)
    with _connect(served.url) as drip:  # one byte every 0.1 s; the deadline is for all of it
        assert _closed_by_server(drip, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 400)
    with _connect(served.url) as idle:  # answered, then idle: closed
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(65536).startswith(b"HTTP/1.1 200")
        assert _closed_by_server(idle)
    assert httpx.get(f"{served.url}/health", timeout=HANG_GUARD).status_code == 200


def test_connections_past_the_cap_are_closed_at_once(gateway: Any) -> None:
    served = gateway(Limits(max_connections=3, header_timeout_s=HANG_GUARD * 4))
    held = [_connect(served.url) for _ in range(3)]
    try:
        for s in held:  # each is accepted (a request on it is answered)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
        with _connect(served.url) as extra:
            assert _closed_by_server(extra)
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + HANG_GUARD
    while True:  # the server sees the held ones close
        try:
            if httpx.get(f"{served.url}/health", timeout=HANG_GUARD).status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "no connection was accepted again"
            time.sleep(0.05)


def test_malformed_requests_are_answered_400_and_logged_once(gateway: Any, caplog: Any) -> None:
    served = gateway(Limits(max_header_bytes=4096))
    uvicorn_log = logging.getLogger("uvicorn")  # it does not propagate to the root logger
    uvicorn_log.addHandler(caplog.handler)
    with caplog.at_level(logging.WARNING):
        for head in [b"NOT HTTP\r\n\r\n"] * 10 + [
                b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192] * 10:  # a head, unfinished
            with _connect(served.url) as s:
                s.sendall(head)
                assert s.recv(65536).startswith(b"HTTP/1.1 400")
    uvicorn_log.removeHandler(caplog.handler)
    said = [r.getMessage() for r in caplog.records if "Invalid HTTP request" in r.getMessage()]
    assert len(said) == 1, said
    assert httpx.get(f"{served.url}/health", timeout=HANG_GUARD).status_code == 200


def test_running_out_of_file_descriptors_is_one_log_line(caplog: Any) -> None:
    """asyncio's error on ``accept`` at EMFILE (once a second while it lasts) is logged as one
    line a minute, without a traceback."""
    loop = asyncio.new_event_loop()
    try:
        quiet_accept_errors(loop, RateLimitedLog(every=60.0))
        with caplog.at_level(logging.WARNING, logger="astraflow.gateway.connections"):
            for _ in range(100):
                loop.call_exception_handler({
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(24, "Too many open files")})
        lines = [r for r in caplog.records if r.name == "astraflow.gateway.connections"]
        assert len(lines) == 1 and lines[0].exc_info is None
        assert "Too many open files" in lines[0].getMessage()
    finally:
        loop.close()


ACCEPTOR = """
import asyncio, sys, time
from astraflow.gateway.connections import GuardedLoop
loop = GuardedLoop() if sys.argv[1] == "guarded" else asyncio.SelectorEventLoop()
failures = 0
def handle(lp, context):
    global failures
    failures += "out of system resource" in context.get("message", "")
loop.set_exception_handler(handle)
held = []
class Hold(asyncio.Protocol):
    def connection_made(self, t): held.append(t)
server = loop.run_until_complete(loop.create_server(Hold, "127.0.0.1", 0, backlog=512))
print(server.sockets[0].getsockname()[1], flush=True)
sys.stdin.readline()  # the flood is queued
loop.run_until_complete(asyncio.sleep(2.5))
print(failures, len(held), flush=True)
"""


def test_out_of_file_descriptors_accept_is_retried_once_a_second() -> None:
    """At EMFILE, the gateway's loop retries ``accept`` about once a second; CPython's own
    loop schedules a retry for every queued connection at every retry (the spin of thousands
    of tracebacks a second). Counted, not timed: 2.5 s of loop time, at most 4 failures."""
    proc = subprocess.Popen([sys.executable, "-c", ACCEPTOR, "guarded"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, preexec_fn=_nofile(40))
    flood: list[socket.socket] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        flood = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        failures, held = map(int, proc.stdout.readline().split())
        assert proc.wait(HANG_GUARD) == 0
    finally:
        for s in flood:
            s.close()
        proc.kill()
    assert 1 <= failures <= 4 and 0 < held < 40, (failures, held)


def _nofile(n: int) -> Any:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return limit


@pytest.mark.slow
def test_serve_at_its_fd_limit_refuses_a_flood_quietly(ascii_dir: Path, tmp_path: Path,
                                                       new_run: Any) -> None:
    """``astraflow serve`` with 256 file descriptors and 300 connections that never finish
    their headers: the ones past its cap are closed at once, the rest at the header deadline;
    then legitimate requests are served (and one over ``max_inflight`` is a 429 with
    Retry-After), and the log holds a line, not a traceback per try."""
    port = free_port()
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({
        "run": "gw", "policies": ["default"],
        "bus": {"url": "embedded://{out}/bus.db", "claims": None},
        "models": {"default": {"path": str(ascii_dir)}},
        "rollout": {"engine": {"threads": 1, "max_new_tokens": 4}},
        "gateway": {"port": port, "header_timeout_s": 2.0, "max_inflight": 2,
                    "retry_after_s": 3}}))
    new_run(config, tmp_path / "run")  # serve joins a run: its bus exists
    log = tmp_path / "serve.log"
    env = {**os.environ, "ASTRAFLOW_LOG_LEVEL": "WARNING"}
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "astraflow.cli.app", "serve", str(config),
                                 "--out", str(tmp_path / "run")], env=env, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=_nofile(256))
    flood: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "astraflow serve did not start"
            time.sleep(0.1)
        for _ in range(300):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                flood.append(s)
            except OSError:
                pass  # refused: as it should be, past the cap
        # the server closes every one of them (past the cap at once, the rest at the deadline)
        for s in flood:
            assert _closed_by_server(s), "a flooding connection was held past its deadline"
        import openai

        client = openai.OpenAI(base_url=f"{url}/sessions/after/v1", api_key="-",
                               max_retries=0, timeout=HANG_GUARD,
                               default_headers={"X-Group-Id": "g", "X-Group-Size": "2"})
        for _ in range(4):
            assert client.chat.completions.create(model="default", messages=USER).choices
        # overloaded: more generations than gateway.max_inflight is a 429 with Retry-After
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model="default", messages=USER, n=3)
        assert e.value.response.headers["Retry-After"] == "3"
        assert e.value.code == "rate_limit_exceeded"
        assert proc.poll() is None
    finally:
        for s in flood:
            s.close()
        proc.terminate()
        proc.wait(60)
    text = log.read_text()
    assert text.count("Traceback") == 0 and len(text.splitlines()) < 20, text[-3000:]
