"""The weight server and the file store open only regular files: a FIFO, a directory or a
symlink in the store directory is answered at once (404, or 403 for a link leading out),
never waited on. Each request carries a timeout, so a server that hangs fails the test rather
than holding it."""

from __future__ import annotations

import contextlib
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from astraflow.weights.server import WeightServer, make_server
from astraflow.weights.store import BlobNotFoundError, FileStore

BLOB = bytes(range(256)) * 8
WAIT_S = 20  # far longer than an answer takes; only a hung server reaches it


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    """A store with one blob, a FIFO, a directory, a link to the FIFO and a link out."""
    root = tmp_path / "store"
    FileStore(root, fsync=False).put("p/blob.afw", BLOB)
    (tmp_path / "outside.afw").write_bytes(b"not for you")
    os.mkfifo(root / "p" / "pipe.afw")
    (root / "p" / "dir.afw").mkdir()
    os.symlink(root / "p" / "pipe.afw", root / "p" / "to-pipe.afw")
    os.symlink(tmp_path / "outside.afw", root / "p" / "out.afw")
    yield root
    _release_fifo_readers(root / "p" / "pipe.afw")


def _release_fifo_readers(fifo: Path) -> None:
    """Open the FIFO for writing once, so that a reader stuck in open() (the bug this file
    tests) returns and its thread ends; no-op when nobody waits."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def server(store_dir: Path) -> Iterator[WeightServer]:
    srv = make_server(store_dir)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    _release_fifo_readers(store_dir / "p" / "pipe.afw")
    srv.shutdown()
    srv.server_close()


def _get(server: WeightServer, path: str, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(server.url + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_fifo_in_the_store_is_a_404_at_once_and_the_server_goes_on(
        server: WeightServer) -> None:
    for method in ("GET", "HEAD"):
        for path in ("/p/pipe.afw", "/p/to-pipe.afw", "/p/dir.afw"):
            code, body = _get(server, path, method)
            assert code == 404, (method, path, code, body)
    assert _get(server, "/p/blob.afw") == (200, BLOB)  # the server still serves


def test_a_symlink_leading_out_of_the_store_is_a_403(server: WeightServer) -> None:
    code, body = _get(server, "/p/out.afw")
    assert code == 403, (code, body)
    assert b"not for you" not in body


def test_the_file_store_refuses_a_fifo_instead_of_waiting_for_a_writer(store_dir: Path) -> None:
    store = FileStore(store_dir)
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(store.read("p/pipe.afw"))
        except BaseException as e:  # noqa: BLE001 - the main thread checks which
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(WAIT_S)
    assert outcome, "FileStore.read of a FIFO did not return: it waits for a writer"
    assert isinstance(outcome[0], BlobNotFoundError) and "FIFO" in str(outcome[0])
    with pytest.raises(BlobNotFoundError, match="not a regular file"):
        store.size("p/pipe.afw")
    with pytest.raises(BlobNotFoundError, match="directory"):
        store.read("p/dir.afw")
    assert store.read("p/blob.afw") == BLOB
