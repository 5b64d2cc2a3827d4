"""The weight server under idle, slow and greedy clients: idle connections are closed, a
request must arrive whole within the idle timeout, connections past the cap get a 503 at once,
running out of descriptors does not make it spin, and a real client is still served. Absurd
Range headers get an answer, not an exception."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import eventually

from astraflow.core.errors import WeightStoreError
from astraflow.weights.http import HttpStore
from astraflow.weights.server import ACCEPT_PAUSE_S, WeightServer, make_server

DATA = bytes(range(256)) * 40


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "served" / "p").mkdir(parents=True)
    (tmp_path / "served" / "p" / "blob.afw").write_bytes(DATA)
    return tmp_path / "served"


@pytest.fixture
def serve(root: Path) -> Iterator:
    started: list[WeightServer] = []

    def start(**kw) -> WeightServer:
        srv = make_server(root, **kw)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def connect(srv: WeightServer) -> socket.socket:
    host, port = srv.server_address[:2]
    return socket.create_connection((host, port), timeout=5)


def closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing ``sock`` within ``seconds``; None: still open."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


def test_idle_connections_are_closed_and_a_real_client_is_served(serve) -> None:
    srv = serve(idle_timeout_s=0.5, auth_timeout_s=0.5, max_connections=4)
    idle = [connect(srv) for _ in range(4)]
    assert eventually(lambda: srv.unauthenticated == 4, 5)
    assert srv.connections == 0  # no request yet: no worker's slot taken
    assert all(closed_within(s, 30) is not None for s in idle)  # 30 s: a hang guard only
    assert eventually(lambda: srv.timed_out == 4, 30), srv.timed_out  # closed by their deadline
    assert srv.evicted == 0
    assert HttpStore(srv.url, timeout=5).read("p/blob.afw") == DATA
    assert srv.refused == 0


def request(sock: socket.socket, token: str | None = None) -> bytes:
    """One ranged GET on ``sock`` (kept alive); the answer's head and its 4 body bytes."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"GET /p/blob.afw HTTP/1.1\r\nHost: x\r\n{auth}Range: bytes=0-3\r\n\r\n"
                 .encode())
    got = b""
    while b"\r\n\r\n" not in got or not got.startswith(b"HTTP/1.1 206") or \
            not got.endswith(DATA[:4]):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def test_past_the_authenticated_cap_a_request_is_answered_503(serve) -> None:
    srv = serve(idle_timeout_s=5, max_connections=4, token="T")
    held = [connect(srv) for _ in range(4)]
    for s in held:  # each served once and kept alive: it holds its slot
        assert request(s, "T").startswith(b"HTTP/1.1 206")
    assert srv.connections == 4
    extra = connect(srv)
    extra.sendall(b"GET /p/blob.afw HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer T\r\n\r\n")
    answer = closed_within(extra, 5) or b""
    assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer
    assert srv.refused == 1
    held.pop().close()
    assert eventually(lambda: srv.connections == 3, 5)
    assert HttpStore(srv.url, token="T", timeout=5).read("p/blob.afw") == DATA


def test_idle_unauthenticated_sockets_never_keep_a_worker_out(serve) -> None:
    """256 idle sockets and 20 wrong-token clients against a server with 4 worker slots: none
    of them takes a slot (the idle ones wait in their own pool, the oldest closed to make
    room; a wrong token is a 401 and a close), and a worker with the token gets its weights
    at once — not after the idle ones time out (``auth_timeout_s`` is far longer than the
    test)."""
    srv = serve(token="T", max_connections=4, max_unauthenticated=8, auth_timeout_s=60)
    idle = [connect(srv) for _ in range(256)]
    try:
        assert eventually(lambda: srv.evicted == 256 - 8, 10), srv.evicted
        assert srv.connections == 0 and srv.unauthenticated <= 8
        for _ in range(20):
            s = connect(srv)
            s.sendall(b"GET /p/blob.afw HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer no\r\n\r\n")
            assert (closed_within(s, 5) or b"").startswith(b"HTTP/1.1 401")  # and closed
            s.close()
        assert srv.connections == 0 and srv.unauthorized == 20
        worker = HttpStore(srv.url, token="T", timeout=5)
        assert worker.read("p/blob.afw") == DATA
        more = [connect(srv) for _ in range(64)]  # and again, with idle sockets arriving
        idle += more
        assert worker.read("p/blob.afw", 0, 16) == DATA[:16]
        assert srv.refused == 0
    finally:
        for s in idle:
            s.close()


def test_a_request_must_arrive_whole_within_the_idle_timeout(serve) -> None:
    """One header byte every 0.1 s never trips a per-read timeout of 0.6 s; the deadline on
    the whole request head closes it all the same (slowloris): the server hangs up in the
    middle of the drip (30 s long, 50 times the deadline), and counts it as timed out."""
    srv = serve(idle_timeout_s=0.6, auth_timeout_s=0.6)
    s = connect(srv)
    head = b"GET /p/blob.afw HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 300
    sent = 0
    try:
        for b in head:
            if select.select([s], [], [], 0)[0]:  # readable: the server closed it
                break
            s.sendall(bytes([b]))
            sent += 1
            time.sleep(0.1)
    except OSError:
        pass  # closed by the server: what we want
    assert sent < len(head), "the server let a dripped request head take the whole drip"
    assert closed_within(s, 30) is not None  # 30 s: a hang guard only
    assert eventually(lambda: srv.timed_out == 1, 30), srv.timed_out
    assert srv.requests == 0


def test_a_keep_alive_connection_serves_several_requests(serve) -> None:
    srv = serve(idle_timeout_s=2)
    s = connect(srv)
    s.settimeout(10)
    for i in range(3):
        s.sendall(b"GET /p/blob.afw HTTP/1.1\r\nHost: x\r\nRange: bytes=0-3\r\n\r\n")
        got = b""
        while not got.endswith(b"\r\n\r\n" + DATA[:4]):
            chunk = s.recv(4096)
            assert chunk, f"the server closed the connection after {i} answers: {got!r}"
            got += chunk
        assert got.startswith(b"HTTP/1.1 206"), got
    s.close()
    assert eventually(lambda: srv.requests == 3, 10), srv.requests  # one connection, three answers


@pytest.mark.parametrize(("value", "status", "body"), [
    ("bytes=" + "9" * 5000 + "-", 416, b""),
    ("bytes=0-" + "9" * 5000, 206, DATA),
    ("bytes=-" + "9" * 5000, 206, DATA),
    ("bytes=10-" + "1" * 30, 206, DATA[10:]),
])
def test_absurd_ranges_get_an_answer(serve, value: str, status: int, body: bytes) -> None:
    import urllib.error
    import urllib.request

    srv = serve()
    req = urllib.request.Request(srv.url + "/p/blob.afw", headers={"Range": value})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            code, got = r.status, r.read()
    except urllib.error.HTTPError as e:
        code, got = e.code, b""
    assert (code, got) == (status, body)


CHILD = textwrap.dedent("""
    import json, os, resource, sys, threading
    from astraflow.weights.server import make_server
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    srv = make_server(sys.argv[1], **json.loads(sys.argv[2]))
    held = []
    if sys.argv[3] == "hog":  # other work in the process took every descriptor but a few
        try:
            while True:
                held.append(open(os.devnull))
        except OSError:
            for f in held[-3:]:
                f.close()
    print(srv.server_address[1], srv.max_connections, flush=True)

    def report():  # a line on stdin: the accept loop's counters on stdout
        for _ in sys.stdin:
            print(json.dumps({"accepted": srv.accepted,
                              "accept_failures": srv.accept_failures}), flush=True)

    threading.Thread(target=report, daemon=True).start()
    srv.serve_forever(poll_interval=0.05)
""")


@pytest.mark.parametrize("hog", ["", "hog"], ids=["idle", "descriptors-taken"])
def test_more_idle_sockets_than_descriptors_neither_spin_nor_starve(root: Path, hog: str) -> None:
    """A server limited to 64 descriptors, 100 idle connections: the cap (clamped under the
    descriptor limit) answers the excess at once; the server does not spin; once the idle ones
    time out, a real client is served. With the descriptors taken by something else in the
    process, accepting fails (EMFILE): it pauses instead of spinning. Spinning is judged by
    the accept loop's own counts, not by CPU time: each failed accept pauses ACCEPT_PAUSE_S,
    so over a window of T seconds at most T / ACCEPT_PAUSE_S + 1 accepts fail, on any
    machine (a spinning loop fails thousands of times a second)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(root),
                             json.dumps({"idle_timeout_s": 1.5, "max_connections": 1000}), hog],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def counts() -> dict[str, int]:
        proc.stdin.write("\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(proc.stdout.readline())  # type: ignore[union-attr]

    socks: list[socket.socket] = []
    try:
        port, cap = map(int, proc.stdout.readline().split())  # type: ignore[union-attr]
        assert cap < 32  # clamped: each connection may hold a socket and an open blob
        for _ in range(100):
            with contextlib.suppress(OSError):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        time.sleep(0.3)
        t0, before = time.monotonic(), counts()
        time.sleep(1.0)
        after = counts()
        window = time.monotonic() - t0  # at least the child's own window
        failed = after["accept_failures"] - before["accept_failures"]
        assert failed <= window / ACCEPT_PAUSE_S + 1, f"{failed} failed accepts in {window:.1f} s"
        assert after["accepted"] <= len(socks)  # no phantom connections either
        if hog:  # the descriptors did run out: the pausing path was taken
            assert after["accept_failures"] >= 1
        if hog:  # the backlog holds the idle ones: let them go (each is then closed at once)
            for s in socks:
                s.close()
        store = HttpStore(f"http://127.0.0.1:{port}", timeout=2)

        def served() -> bool:
            try:
                return store.read("p/blob.afw", 0, 16) == DATA[:16]
            except WeightStoreError:
                return False

        assert eventually(served, 10, every=0.2)
    finally:
        for s in socks:
            s.close()
        proc.kill()
        proc.wait()


def test_a_client_gone_mid_answer_is_counted_without_a_traceback(
        serve, root: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (root / "p" / "big.afw").write_bytes(os.urandom(8 << 20))  # more than the socket buffers
    srv = serve()
    rst = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER 0: close() sends an RST
    for _ in range(2):  # gone while the answer is written
        s = connect(srv)
        s.sendall(b"GET /p/big.afw HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(1024)  # the answer has started
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, rst)
        s.close()
    s = connect(srv)  # gone in the middle of its request head
    s.sendall(b"GET /p/big.afw HTTP/1.1\r\nHo")
    time.sleep(0.2)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, rst)
    s.close()
    assert eventually(lambda: srv.client_errors == 3, 10), srv.client_errors
    assert "Traceback" not in capfd.readouterr().err
    assert HttpStore(srv.url).read("p/blob.afw") == DATA  # still serving
