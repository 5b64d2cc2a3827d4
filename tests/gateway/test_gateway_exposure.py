"""What reaches the gateway from outside its clients: one peer holding sockets open cannot
starve the others' connections; without a token, a request whose Host or Origin is not
loopback (a web page's cross-site call, DNS rebinding) is refused; the documented head limit
holds however the head arrives; generated session ids are 128 random bits."""

from __future__ import annotations

import re
import socket
from typing import Any

import httpx
import pytest
from gateway_helpers import check_error

from astraflow.gateway.limits import Limits

HANG_GUARD = 30.0  # seconds; only a hang ever waits this long
CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def echo(rule_engine: Any, ascii_tokenizer: Any) -> Any:
    return rule_engine(ascii_tokenizer, lambda p: "ok")


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_one_peer_holding_sockets_cannot_starve_the_others(serve: Any, echo: Any) -> None:
    """A client on 127.0.0.2 opens as many sockets as the gateway holds in all and sends
    nothing; every /health call from 127.0.0.1 meanwhile is answered."""
    served = serve(echo, limits=Limits(max_connections=16, max_connections_per_peer=4,
                                       header_timeout_s=HANG_GUARD * 4))
    held = []
    try:
        for _ in range(16):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.settimeout(HANG_GUARD)
            s.connect(("127.0.0.1", _port(served.url)))
            held.append(s)
        honest = [httpx.get(f"{served.url}/health", timeout=HANG_GUARD).status_code
                  for _ in range(30)]
        assert honest == [200] * 30
    finally:
        for s in held:
            s.close()


def _post(served: Any, headers: dict[str, str], path: str = CHAT) -> httpx.Response:
    return httpx.post(f"{served.url}{path}", json=BODY, headers=headers, timeout=HANG_GUARD)


def test_without_a_token_only_loopback_hosts_and_origins_are_served(serve: Any,
                                                                    echo: Any) -> None:
    served = serve(echo)
    port = _port(served.url)
    for host in ("evil.example", f"evil.example:{port}", "10.0.0.7", "localhost.evil.example"):
        check_error(_post(served, {"Host": host}), 403, "host_not_allowed")
        check_error(_post(served, {"Host": host}, "/sessions/s1/v1/chat/completions"), 403,
                    "host_not_allowed")
    for origin in ("http://evil.example", "null", "https://evil.example:443"):
        check_error(_post(served, {"Origin": origin}), 403, "origin_not_allowed")
    check_error(_post(served, {"Host": "rebound.example", "Origin": "http://rebound.example"},
                      "/sessions"), 403, "host_not_allowed")
    assert served.gw.store.open_count == 0  # nothing refused opened a session
    for headers in ({}, {"Host": f"localhost:{port}"}, {"Host": f"[::1]:{port}"},
                    {"Origin": "http://localhost:3000"}, {"Origin": "http://127.0.0.1:8080"}):
        assert _post(served, headers).status_code == 200, headers
    health = httpx.get(f"{served.url}/health", headers={"Host": "evil.example"})
    assert health.status_code == 200  # open, as with a token


def test_allowed_hosts_and_a_token_widen_the_rule(serve: Any, echo: Any) -> None:
    listed = serve(echo, limits=Limits(allowed_hosts=("gw.internal",)))
    assert _post(listed, {"Host": "gw.internal:8000"}).status_code == 200
    assert _post(listed, {"Origin": "https://gw.internal"}).status_code == 200
    check_error(_post(listed, {"Host": "other.example"}), 403, "host_not_allowed")
    token = serve(echo, token="s3cret")
    auth = {"Authorization": "Bearer s3cret"}
    assert _post(token, {**auth, "Host": "gw.example.com"}).status_code == 200
    check_error(_post(token, {"Host": "gw.example.com"}), 401, "invalid_api_key")


def _send_head(url: str, pad: int) -> bytes:
    """The first bytes answered to a GET /health whose head, sent whole at once, carries a
    ``pad``-byte header."""
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=HANG_GUARD) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * pad
                  + b"\r\n\r\n")
        return s.recv(65536)


def test_a_head_over_the_limit_is_refused_however_it_arrives(serve: Any, echo: Any) -> None:
    served = serve(echo)  # the documented 16 KiB
    assert _send_head(served.url, 15 << 10).startswith(b"HTTP/1.1 200")
    for pad in (17 << 10, 40 << 10):  # whole, in one read: parsed, then refused
        assert _send_head(served.url, pad).startswith(b"HTTP/1.1 431"), pad
    # over one read (64 KiB): still unfinished past the limit, refused by the parser
    assert _send_head(served.url, 70 << 10).startswith((b"HTTP/1.1 431", b"HTTP/1.1 400"))
    assert httpx.get(f"{served.url}/health", timeout=HANG_GUARD).status_code == 200


def test_generated_session_ids_are_128_random_bits(serve: Any, echo: Any) -> None:
    served = serve(echo)
    ids = {served.post("/sessions", {}).json()["id"] for _ in range(20)}
    assert len(ids) == 20 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids), ids
