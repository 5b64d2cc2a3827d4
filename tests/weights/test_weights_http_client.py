"""The HTTP weight client against servers that lie, drip, redirect or send garbage: it reads no
more than it expects, gives up at its deadline, never follows a redirect (so the token never
leaves for another origin), and every failure is a WeightStoreError; the syncer's run() lives
through all of it and retries until the store behaves."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from weights_adversary import RawServer, Request, drip, reply, serve_files, stream

from astraflow.core.errors import WeightStoreError
from astraflow.weights.http import HttpStore
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import download
from astraflow.weights.syncer import Syncer
from astraflow.weights.target import DictTarget

BLOB = "p/b.afw"


@pytest.fixture
def raw_servers():
    started: list[RawServer] = []

    def start(respond) -> RawServer:
        s = RawServer(respond)
        started.append(s)
        return s

    yield start
    for s in started:
        s.close()


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",  # no length: to the end of the stream
    b"HTTP/1.1 200 OK\r\nContent-Length: 20000000\r\n\r\n",  # more than the manifest says
], ids=["no-length", "longer"])
def test_a_download_never_takes_more_than_the_expected_size(raw_servers, tmp_path: Path,
                                                            head: bytes) -> None:
    srv = raw_servers(stream(head, 20_000_000))
    dest = tmp_path / "c" / "b.afw"
    with pytest.raises(WeightStoreError):
        download(HttpStore(srv.url, timeout=5), BLOB, dest, size=1000, deadline_s=10)
    part = dest.with_name("b.afw.part")
    assert not dest.exists()
    assert not part.exists() or part.stat().st_size <= 1000
    with pytest.raises(WeightStoreError):  # a whole read into memory: the same bound
        HttpStore(srv.url, timeout=5).read(BLOB, 0, 1000)


def test_a_longer_local_blob_is_copied_only_to_the_expected_size(tmp_path: Path) -> None:
    from astraflow.weights.store import FileStore

    store = FileStore(tmp_path / "s")
    store.put(BLOB, bytes(5000))
    dest = tmp_path / "c" / "b.afw"
    download(store, BLOB, dest, size=1000)
    assert dest.stat().st_size == 1000  # the manifest's digests judge the bytes next


def test_a_slow_drip_ends_at_the_deadline_and_resumes(raw_servers, tmp_path: Path) -> None:
    body = bytes(range(200))
    srv = raw_servers(drip(b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\n", body, 0.05))
    dest = tmp_path / "c" / "b.afw"
    t0 = time.monotonic()
    with pytest.raises(WeightStoreError, match="deadline"):  # the drip takes 10 s
        download(HttpStore(srv.url, timeout=5), BLOB, dest, size=200, deadline_s=0.6)
    assert time.monotonic() - t0 < 30  # a hang guard only; the deadline is judged below
    part = dest.with_name("b.afw.part")
    assert 0 < part.stat().st_size < 200 and part.read_bytes() == body[:part.stat().st_size]


def test_a_dripped_response_head_ends_at_the_timeout(raw_servers) -> None:
    """Each byte arrives well inside the per-read timeout; the request as a whole does not."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    srv = raw_servers(drip(b"", head + bytes(10), 0.02))
    t0 = time.monotonic()
    with pytest.raises(WeightStoreError, match="deadline"):  # the whole head takes 4.6 s
        HttpStore(srv.url, timeout=0.8).size(BLOB)
    assert time.monotonic() - t0 < 30  # a hang guard only
    assert len(srv.requests) == 1  # one try, not retried past its deadline


def test_redirects_are_not_followed_and_the_token_stays_home(raw_servers, tmp_path: Path) -> None:
    elsewhere = raw_servers(reply(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"))
    srv = raw_servers(reply(f"HTTP/1.1 302 Found\r\nLocation: {elsewhere.url}/{BLOB}\r\n"
                            "Content-Length: 0\r\n\r\n".encode()))
    store = HttpStore(srv.url, token="s3cret", timeout=5)
    for call in (lambda: store.size(BLOB), lambda: store.read(BLOB),
                 lambda: download(store, BLOB, tmp_path / "b.afw", size=3)):
        with pytest.raises(WeightStoreError, match="redirect"):
            call()
    assert srv.requests and srv.requests[0].headers["authorization"] == "Bearer s3cret"
    assert elsewhere.requests == []


MALFORMED = {
    "status-line": b"garbage\r\n\r\n",
    "length-word": b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n0123456789",
    "length-negative": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n0123456789",
    "length-huge": b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n0123",
    "truncated": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789",
    "wrong-range": (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n"
                    b"Content-Range: bytes 0-9/100\r\n\r\n0123456789"),
    "no-range": b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n\r\n0123456789",
    "bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc",
    "odd-status": b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
    "many-headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n",
    "closed": b"",
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_malformed_responses_are_weight_store_errors(raw_servers, tmp_path: Path,
                                                     kind: str) -> None:
    srv = raw_servers(reply(MALFORMED[kind]))
    store = HttpStore(srv.url, timeout=5)
    calls = {
        "size": lambda: store.size(BLOB),
        "exists": lambda: store.exists(BLOB),
        "read": lambda: store.read(BLOB),
        "read-range": lambda: store.read(BLOB, 50, 10),
        "open": lambda: store.open(BLOB, 50).read(),
        "download": lambda: download(store, BLOB, tmp_path / "a" / "b.afw", size=100),
        "download-asking-size": lambda: download(store, BLOB, tmp_path / "b" / "b.afw"),
    }
    if kind == "truncated":  # as the answer to a HEAD, a complete one
        assert store.size(BLOB) == 1000 and store.exists(BLOB)
        del calls["size"], calls["exists"]
    for name, call in calls.items():
        try:
            call()
        except WeightStoreError:
            continue
        except Exception as e:  # noqa: BLE001 - the defect this test is about
            pytest.fail(f"{name}: {type(e).__name__}: {e}")
        pytest.fail(f"{name}: no error")


def test_syncer_run_survives_bad_servers_and_retries(bus, store, raw_servers,
                                                     tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    versions = [{"w": rng.integers(0, 1 << 16, (64, 32), dtype=np.uint16)}]
    versions.append({"w": versions[0]["w"] ^ 1})
    pub = Publisher(bus, run="t", policy="p", store=store, dtype=None)
    for v, tensors in enumerate(versions):
        pub.publish(tensors, v)
        pub.flush()
    pub.close()
    bad = list(MALFORMED.values())[:6]
    good = serve_files(store.root)

    def respond(conn, req: Request) -> None:
        if bad:
            conn.sendall(bad.pop(0))
        else:
            good(conn, req)

    srv = raw_servers(respond)
    target = DictTarget({})
    syncer = Syncer(bus, run="t", policy="p", store=HttpStore(srv.url, timeout=5),
                    target=target, cache_dir=tmp_path / "cache")
    syncer.run(timeout=3, poll_timeout=0.05)
    assert not bad, "every bad answer was met"
    assert syncer.stats.failures >= 1
    assert syncer.version == 1 and target.tensors["w"].tobytes() == versions[1]["w"].tobytes()
