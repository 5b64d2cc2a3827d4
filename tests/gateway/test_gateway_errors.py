"""Bad input gets OpenAI's error object with the right status, records nothing, and the
server keeps serving; a client that disconnects mid-stream or mid-generation leaves one
recorded call, not two."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest
from gateway_helpers import check_error

USER = [{"role": "user", "content": "hi"}]
CHAT = "/sessions/bad/v1/chat/completions"


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), [
    (CHAT, b'{"messages": [', 400, "invalid_json", None),
    (CHAT, {"messages": USER, "temperatur": 1}, 400, "unknown_parameter", "temperatur"),
    (CHAT, {"messages": USER, "max_tokens": -5}, 400, "invalid_value", "max_tokens"),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400, "invalid_value",
     "max_completion_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": "x" * 5000}]}, 400,
     "context_length_exceeded", "messages"),
    (CHAT, {"messages": [{"role": "user", "content": "caf\u00e9"}]}, 400, "invalid_prompt",
     "messages"),
    (CHAT, {"messages": []}, 400, "invalid_value", "messages"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                       "image_url": {"url": "x"}}]}]}, 400,
     "invalid_value", None),
    (CHAT, {"messages": USER, "model": "gpt-4o"}, 404, "model_not_found", "model"),
    (CHAT, {"messages": USER, "frequency_penalty": 0.5}, 400, "unsupported_value",
     "frequency_penalty"),
    (CHAT, {"messages": USER, "tool_choice": "required"}, 400, "unsupported_value",
     "tool_choice"),
    (CHAT, {"messages": USER, "n": 100}, 400, "invalid_value", "n"),
    (CHAT, {"messages": USER, "stop": [""]}, 400, "invalid_value", "stop"),
    ("/v1/completions", {"prompt": "1+1=", "echo": True}, 400, "unsupported_value", "echo"),
    ("/v1/completions", {"prompt": [1, -3]}, 400, "invalid_prompt", "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "invalid_prompt", "prompt"),
    ("/sessions/bad id/v1/completions", {"prompt": "1"}, 400, "invalid_session_id",
     "session_id"),
    ("/v1/nothing", {}, 404, None, None),
    ("/sessions/bad/reward", {"reward": "lots"}, 400, "invalid_value", "reward"),
    ("/sessions/bad/reward", {}, 400, "invalid_value", "reward"),
    # a reward is a JSON number: not a boolean, not a numeric string
    ("/sessions/bad/reward", {"reward": True}, 400, "invalid_value", "reward"),
    ("/sessions/bad/reward", {"reward": "1.5"}, 400, "invalid_value", "reward"),
    ("/sessions/bad/reward", {"reward": 1, "rewards": {"a": False}}, 400, "invalid_value",
     "rewards.a"),
    ("/sessions/bad/end", {"reward": True}, 400, "invalid_value", "reward"),
    # the whole id is checked: a trailing newline is not an id
    ("/sessions/good%0A/v1/completions", {"prompt": "1"}, 400, "invalid_session_id",
     "session_id"),
    ("/sessions/good%0A/reward", {"reward": 1}, 400, "invalid_session_id", "session_id"),
])
def test_bad_requests_get_openai_errors(serve: Any, rule_engine: Any, ascii_tokenizer: Any,
                                        path: str, body: Any, status: int, code: str | None,
                                        param: str | None) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"), max_n=8, context_length=256)
    kwargs = ({"content": body, "headers": {"Content-Type": "application/json"}}
              if isinstance(body, bytes) else {})
    resp = served.post(path, None if isinstance(body, bytes) else body, **kwargs)
    err = check_error(resp, status, code)
    if param is not None:
        assert err["param"] == param, err
    assert served.events("bad", "call") == []  # nothing recorded
    # the server keeps serving, the session too
    ok = served.post(CHAT, {"messages": USER})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "ok"


def test_headers_and_methods(serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> None:
    served = serve(rule_engine(ascii_tokenizer, lambda p: "ok"))
    err = check_error(served.post("/v1/chat/completions", {"messages": USER},
                                  headers={"X-Sample-Index": "first", "X-Session-Id": "h"}),
                      400, "invalid_value")
    assert err["param"] == "X-Sample-Index"
    check_error(served.get("/v1/chat/completions"), 405)
    check_error(served.post("/sessions/h/v1/chat/completions", {"messages": USER},
                            headers={"Idempotency-Key": "k" * 300}), 400, "invalid_value")


def _raw_post(port: int, path: str, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_client_disconnecting_records_the_call_once(serve: Any, rule_engine: Any,
                                                    ascii_tokenizer: Any) -> None:
    release = threading.Event()

    def rule(prompt: str) -> str:
        if "wait" in prompt:
            release.wait(10)
        return "y" * 120

    served = serve(rule_engine(ascii_tokenizer, rule))
    port = served.srv.port
    # mid-stream: read the first event, hang up
    sock = _raw_post(port, "/sessions/dc/v1/chat/completions",
                     {"messages": USER, "stream": True, "max_tokens": 200})
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(256)
        assert chunk, got
        got += chunk
    sock.close()
    # mid-generation: hang up before anything was answered
    sock = _raw_post(port, "/sessions/dc2/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "wait"}]})
    deadline = time.monotonic() + 10
    while served.gw.inflight == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sock.close()
    release.set()
    # the server keeps serving, and each abandoned call is recorded exactly once
    assert served.client("dc").chat.completions.create(model="default", messages=USER)
    deadline = time.monotonic() + 10
    while len(served.events("dc2", "call")) < 1:
        assert time.monotonic() < deadline, "the abandoned generation was not recorded"
        time.sleep(0.05)
    time.sleep(0.2)
    assert len(served.events("dc", "call")) == 2  # the streamed call and the one after it
    assert len(served.events("dc2", "call")) == 1
    info = served.get("/sessions/dc").json()
    assert info["calls"] == 2 and info["drift"] == 0
