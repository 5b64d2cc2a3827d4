"""What a hostile or careless client cannot do to the gateway's memory and capacity: refused
prompts leave nothing in the template cache (and accepted ones never take it past its bound in
bytes), refused session ids leave no lock, closed sessions are forgotten after their retention,
one client cannot hold every session (and the cap is exact when many open at once), an
Idempotency-Key replays an answer only to the client that asked, with the same request, and a
number too large for the records is a 400, not a crash."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from gateway_helpers import Served, check_error

CHAT = "/v1/chat/completions"
KEYS = {"alice": "key-a", "bob": "key-b", "carol": "key-c"}


def _as(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def _chat(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


@pytest.fixture
def echo(rule_engine: Any, ascii_tokenizer: Any) -> Any:
    return rule_engine(ascii_tokenizer, lambda p: "ok")


def _on_loop(served: Served, coro: Any) -> Any:
    """``coro`` run on the gateway's own event loop (the store is touched there only)."""
    assert served.gw.loop is not None
    return asyncio.run_coroutine_threadsafe(coro, served.gw.loop).result(timeout=60)


@pytest.mark.slow  # 9-35 s here: out of the unit part (scripts/test.sh unit)
def test_refused_prompts_never_fill_the_template_cache(serve: Any, echo: Any) -> None:
    """1,000 distinct prompts over the context, each refused (400): the cache of rendered
    templates holds 0 bytes after them; accepted distinct prompts fill it up to its bound in
    bytes and no further."""
    bound = 16 << 10
    served = serve(echo, context_length=128, template_cache_bytes=bound)
    big = "x" * 2048  # 2 KiB: far over the 128-token context with the ascii tokenizer

    def refused(i: int) -> int:
        r = served.post(CHAT, _chat(f"{i} {big}"))
        return r.status_code if r.json()["error"]["code"] == "context_length_exceeded" else -1

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(refused, range(1000)))
    assert codes == [400] * 1000
    assert served.gw.templates.size().bytes == 0 and len(served.gw.templates) == 0
    for i in range(200):  # distinct prompts that are served: cached, within the bound
        r = served.post(CHAT, _chat(f"question {i}: " + "y" * 60))
        assert r.status_code == 200, r.text
        size = served.gw.templates.size()
        assert 0 < size.bytes <= bound, size
    assert len(served.gw.templates) < 200  # the oldest went: the bound held


def test_refused_session_ids_leave_no_lock(serve: Any, echo: Any) -> None:
    served = serve(echo, store_kwargs={"max_open_sessions": 2})
    for sid in ("a", "b"):
        assert served.post("/sessions", {"session_id": sid}).status_code == 201
    for i in range(50):  # full: refused, by POST /sessions and by a first call
        check_error(served.post("/sessions", {"session_id": f"x{i}"}), 429)
        check_error(served.post(f"/sessions/y{i}/v1/chat/completions", _chat("hi")), 429)
    served.post("/sessions/a/reward", {"reward": 1.0})
    served.post("/sessions/a/end", {})
    check_error(served.post("/sessions/a/v1/chat/completions", _chat("hi")), 409,
                "session_closed")
    held = served.gw.store.footprint()  # a lock for the open session at most
    assert held.open == 1 and held.locks <= 1 and held.opening == 0, held


def test_closed_sessions_are_forgotten_after_their_retention(serve: Any, echo: Any) -> None:
    served = serve(echo, store_kwargs={"closed_retention_s": 600.0})
    for i in range(5):
        sid = f"s{i}"
        assert served.post(f"/sessions/{sid}/v1/chat/completions", _chat("hi")).status_code == 200
        assert served.post(f"/sessions/{sid}/end", {"reward": 1.0}).json()["done"] is True
    assert served.gw.store.footprint().closed == 5
    check_error(served.post("/sessions/s0/v1/chat/completions", _chat("hi")), 409,
                "session_closed")  # remembered within the retention
    _on_loop(served, served.gw.expire(now=time.time() + 601))  # the reaper's pass, later
    assert served.gw.store.footprint().closed == 0
    check_error(served.get("/sessions/s1"), 404, "session_not_found")


def _open_all(served: Served, who: list[tuple[str, str]]) -> list[tuple[str, int]]:
    """(client, status) of opening each (client, session id) of ``who`` at once."""
    def open_one(item: tuple[str, str]) -> tuple[str, int]:
        name, sid = item
        r = httpx.post(f"{served.url}/sessions", json={"session_id": sid}, headers=_as(name),
                       timeout=60)
        assert r.status_code in (201, 429), r.text
        return name, r.status_code
    with ThreadPoolExecutor(len(who)) as pool:
        return list(pool.map(open_one, who))


def test_one_client_cannot_hold_every_session(serve: Any, echo: Any) -> None:
    """Three keys, 10 sessions at most, 3 each: alice opening 30 at once gets 3, and bob and
    carol still get theirs."""
    served = serve(echo, keys=KEYS, store_kwargs={"max_open_sessions": 10,
                                                   "max_open_per_owner": 3})
    got = _open_all(served, [("alice", f"a{i}") for i in range(30)])
    assert sum(code == 201 for _, code in got) == 3
    got = _open_all(served, [(n, f"{n}{i}") for n in ("bob", "carol") for i in range(10)])
    assert sorted(n for n, code in got if code == 201) == ["bob"] * 3 + ["carol"] * 3
    r = httpx.post(f"{served.url}/sessions", json={}, headers=_as("alice"), timeout=60)
    check_error(r, 429, "rate_limit_exceeded")
    assert "max_open_sessions_per_client" in r.json()["error"]["message"]


def test_the_session_cap_is_exact_under_concurrency(serve: Any, echo: Any) -> None:
    served = serve(echo, store_kwargs={"max_open_sessions": 5})
    got = _open_all(served, [("alice", f"c{i}") for i in range(40)])
    assert sum(code == 201 for _, code in got) == 5
    assert served.gw.store.open_count == 5


def test_an_idempotency_key_replays_only_to_its_client_and_request(serve: Any,
                                                                   echo: Any) -> None:
    served = serve(echo, keys=KEYS)
    key = {"Idempotency-Key": "same-key"}
    body = {**_chat("alice's secret question"), "return_token_ids": True}
    first = httpx.post(f"{served.url}{CHAT}", json=body, headers={**_as("alice"), **key})
    assert first.status_code == 200
    retry = httpx.post(f"{served.url}{CHAT}", json=body, headers={**_as("alice"), **key})
    assert retry.json() == first.json()  # a retry by its client: the recorded answer
    other = httpx.post(f"{served.url}{CHAT}", json={**_chat("bob"), "return_token_ids": True},
                       headers={**_as("bob"), **key})
    same = httpx.post(f"{served.url}{CHAT}", json=body, headers={**_as("bob"), **key})
    for r in (other, same):  # another client, same key: its own answer
        assert r.status_code == 200 and r.json()["id"] != first.json()["id"]
    assert other.json()["prompt_token_ids"] != first.json()["prompt_token_ids"]
    changed = httpx.post(f"{served.url}{CHAT}", json={**body, **_chat("another question")},
                         headers={**_as("alice"), **key})
    assert changed.json()["id"] != first.json()["id"]  # same client, other request


@pytest.mark.parametrize(("send", "param"), [
    ({"headers": {"X-Sample-Index": str(2**64 + 1), "X-Session-Id": "n1"}}, "X-Sample-Index"),
    ({"headers": {"X-Group-Size": str(10**30), "X-Session-Id": "n2"}}, "X-Group-Size"),
    ({"headers": {"X-Sample-Index": "1_000", "X-Session-Id": "n3"}}, "X-Sample-Index"),
    ({"headers": {"X-Sample-Index": "-" + "9" * 40, "X-Session-Id": "n4"}}, "X-Sample-Index"),
    ({"path": "/sessions", "json": {"session_id": "n5", "sample_index": 2**64 + 1}},
     "sample_index"),
    ({"path": "/sessions", "json": {"session_id": "n6", "group_size": 2**70}}, "group_size"),
    ({"json": {**_chat("hi"), "max_tokens": 2**64}}, "max_tokens"),
    ({"json": {**_chat("hi"), "seed": 2**64}}, "seed"),
])
def test_a_number_too_large_is_a_400(serve: Any, echo: Any, caplog: Any,
                                     send: dict[str, Any], param: str) -> None:
    served = serve(echo)
    with httpx.Client(base_url=served.url, timeout=60) as client, \
            caplog.at_level(logging.ERROR, logger="astraflow"):
        r = client.post(send.get("path", CHAT), json=send.get("json", _chat("hi")),
                        headers=send.get("headers"))
        err = check_error(r, 400, "invalid_value")
        assert err["param"] == param and param in err["message"]
        assert client.get("/health").status_code == 200  # still served
    assert not [rec for rec in caplog.records if rec.exc_info], caplog.text
    assert served.gw.store.open_count == 0
