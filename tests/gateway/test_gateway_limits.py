"""What one request may cost: a body over the limit is a 413 before the rest of it is read, too
many or too long messages are a 400, tokenization runs on its own threads (``/health`` and other
sessions answer while a prompt is tokenized; 429 with Retry-After when too many wait), and the
gateway holds at most a few requests in flight (429 with Retry-After, through the SDK)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from gateway_helpers import check_error

from astraflow.gateway.limits import TOKENIZER_THREAD, Limits

USER = [{"role": "user", "content": "Hello"}]
HANG_GUARD = 30.0  # seconds; only a hang ever waits this long


class GatedTokenizer:
    """The real tokenizer, but encoding a text that holds ``HOLD`` waits until the test opens
    the gate (a prompt that takes as long to tokenize as the test says). Records the threads
    that encoded."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.threads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def __len__(self) -> int:
        return len(self._tok)

    def __call__(self, text: Any, **kwargs: Any) -> Any:
        self._hold(text)
        return self._tok(text, **kwargs)

    @property
    def backend_tokenizer(self) -> Any:
        return None  # through __call__, where the gate is

    def _hold(self, text: Any) -> None:
        if isinstance(text, str) and "HOLD" in text:
            self.threads.append(threading.current_thread().name)
            self.entered.set()
            assert self.gate.wait(HANG_GUARD), "the test never opened the gate"


def _raw(url: str, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) on a new connection; everything answered until the server
    closes it."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD) as s:
        s.sendall(head + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_a_body_over_the_limit_is_413_before_it_is_read(serve: Any, rule_engine: Any,
                                                       ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"),
                   limits=Limits(max_body_bytes=64 << 10))
    # announced too large: answered before a byte of the body is sent (a server that read it
    # would wait for 10 MB that never come)
    out = _raw(served.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 10000000\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    assert b"request_too_large" in out and b"connection: close" in out.lower()
    # chunked, no length: refused once more than the limit has come; the rest is never sent
    chunk = b"x" * (16 << 10)
    out = _raw(served.url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
               b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(6)))
    assert out.startswith(b"HTTP/1.1 413"), out[:200]
    # the SDK gets an OpenAI error; a body within the limit is served
    r = httpx.post(f"{served.url}/v1/chat/completions", timeout=HANG_GUARD,
                   json={"messages": [{"role": "user", "content": "y" * (100 << 10)}]})
    check_error(r, 413, "request_too_large")
    ok = served.client().chat.completions.create(model="default", messages=USER)
    assert ok.choices[0].message.content == "ok"


def test_too_many_or_too_long_messages_are_400(serve: Any, rule_engine: Any,
                                               ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"),
                   limits=Limits(max_messages=4, max_message_chars=100))
    client = served.client("lim")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=USER * 5)
    assert e.value.code == "too_many_messages" and e.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=[
            *USER, {"role": "user", "content": [{"type": "text", "text": "z" * 101}]}])
    assert e.value.code == "message_too_long" and e.value.param == "messages.1"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default", prompt="z" * 101)
    assert e.value.code == "message_too_long"
    assert client.chat.completions.create(model="default", messages=USER * 4).choices


def test_tokenizing_runs_off_the_event_loop(serve: Any, rule_engine: Any,
                                            ascii_tokenizer: Any) -> None:
    """While one prompt is being tokenized (held as long as the test likes), /health and
    another session's calls are answered; the tokenization ran on a tokenizer thread."""
    tok = GatedTokenizer(ascii_tokenizer)
    served = serve(rule_engine(tok, lambda p: "ok"), limits=Limits(max_tokenizing=2))
    held: dict[str, Any] = {}
    caller = threading.Thread(target=lambda: held.setdefault("r", served.client("a").chat.
                              completions.create(model="default", messages=[
                                  {"role": "user", "content": "HOLD " * 1000}])))
    caller.start()
    try:
        assert tok.entered.wait(HANG_GUARD), "the held prompt was never tokenized"
        health = httpx.get(f"{served.url}/health", timeout=HANG_GUARD)
        assert health.status_code == 200
        other = served.client("b").chat.completions.create(model="default", messages=USER)
        assert other.choices[0].message.content == "ok"
    finally:
        tok.gate.set()
        caller.join(HANG_GUARD)
    assert held["r"].choices[0].message.content == "ok"
    assert tok.threads and all(t.startswith(TOKENIZER_THREAD) for t in tok.threads), tok.threads


def test_too_many_waiting_tokenizations_are_429(serve: Any, rule_engine: Any,
                                                ascii_tokenizer: Any) -> None:
    tok = GatedTokenizer(ascii_tokenizer)
    served = serve(rule_engine(tok, lambda p: "ok"),
                   limits=Limits(max_tokenizing=1, max_tokenize_waiting=0, retry_after_s=7))
    caller = threading.Thread(target=lambda: served.client("a").chat.completions.create(
        model="default", messages=[{"role": "user", "content": "HOLD"}]))
    caller.start()
    try:
        assert tok.entered.wait(HANG_GUARD)
        with pytest.raises(openai.RateLimitError) as e:
            served.client("b").chat.completions.create(model="default", messages=USER)
        assert e.value.response.headers["Retry-After"] == "7"
        assert e.value.code == "rate_limit_exceeded"
    finally:
        tok.gate.set()
        caller.join(HANG_GUARD)
    assert served.client("b").chat.completions.create(model="default", messages=USER).choices


def test_a_full_gateway_answers_the_sdk_429_with_retry_after(serve: Any, rule_engine: Any,
                                                             ascii_tokenizer: Any) -> None:
    """Overload through the official SDK: with max_inflight generations running, the next
    call is a RateLimitError whose response carries Retry-After; the SDK's own retry (which
    honours Retry-After) gets through once the running ones finish."""
    release = threading.Event()

    def slow(prompt: str) -> str:
        assert release.wait(HANG_GUARD)
        return "ok"

    served = serve(rule_engine(ascii_tokenizer, slow), max_inflight=1,
                   store_kwargs={"retry_after_s": 1})
    running = threading.Thread(target=lambda: served.client("a").chat.completions.create(
        model="default", messages=USER))
    running.start()
    try:
        deadline = time.monotonic() + HANG_GUARD
        while served.gw.inflight == 0:
            assert running.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError) as e:
            served.client("b").chat.completions.create(model="default", messages=USER)
        assert e.value.response.headers["Retry-After"] == "1"
        check_error(e.value.response, 429, "rate_limit_exceeded")
    finally:
        release.set()
        running.join(HANG_GUARD)
    retrying = openai.OpenAI(base_url=f"{served.url}/sessions/b/v1", api_key="-",
                             max_retries=3)
    assert retrying.chat.completions.create(model="default", messages=USER).choices
