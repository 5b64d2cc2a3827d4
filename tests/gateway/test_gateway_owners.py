"""A session belongs to the client that opened it: another client (its own key) gets 404 for
every route of it, and cannot replay its answers; idle sessions end as abandoned (trajectories
with that finish reason, counted) and stop counting against ``max_open_sessions``;
``astraflow serve`` refuses a non-loopback address without a credential."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from gateway_helpers import Served, check_error

from astraflow.core.bus import connect
from astraflow.core.errors import ConfigError
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.topics import run_topics
from astraflow.gateway.app import create_app
from astraflow.gateway.auth import check_exposure
from astraflow.gateway.server import ServerThread
from astraflow.gateway.service import Gateway
from astraflow.gateway.store import SessionStore

KEYS = {"alice": "key-a", "bob": "key-b"}
USER = [{"role": "user", "content": "hi"}]


def _serve(engine: Any, tmp_path: Path, **store_kwargs: Any) -> Served:
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    metrics = MetricsEmitter(bus, run="r", role="gateway", interval=60)
    gw = Gateway({"default": engine}, SessionStore(bus, run="r", metrics=metrics,
                                                   **store_kwargs), metrics=metrics)
    srv = ServerThread(create_app(gw, keys=KEYS)).start()
    return Served(srv.url, gw, bus, "r", srv)


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_another_client_gets_404_for_a_session(rule_engine: Any, ascii_tokenizer: Any,
                                               tmp_path: Path) -> None:
    served = _serve(rule_engine(ascii_tokenizer, lambda p: "ok"), tmp_path)
    url = served.url
    try:
        alice = openai.OpenAI(base_url=f"{url}/sessions/a1/v1", api_key=KEYS["alice"],
                              max_retries=0)
        alice.chat.completions.create(model="default", messages=USER,  # type: ignore[arg-type]
                                      extra_headers={"Idempotency-Key": "k1"})
        bob = openai.OpenAI(base_url=f"{url}/sessions/a1/v1", api_key=KEYS["bob"],
                            max_retries=0)
        with pytest.raises(openai.NotFoundError):  # no call into it, no replay of its answer
            bob.chat.completions.create(model="default", messages=USER,  # type: ignore[arg-type]
                                        extra_headers={"Idempotency-Key": "k1"})
        with pytest.raises(openai.NotFoundError):
            bob.chat.completions.create(model="default", messages=USER)  # type: ignore[arg-type]
        b = _as(KEYS["bob"])
        check_error(httpx.get(f"{url}/sessions/a1", headers=b), 404, "session_not_found")
        check_error(httpx.post(f"{url}/sessions/a1/reward", json={"reward": 0.0}, headers=b),
                    404, "session_not_found")
        check_error(httpx.post(f"{url}/sessions/a1/end", json={}, headers=b), 404,
                    "session_not_found")
        check_error(httpx.post(f"{url}/sessions", json={"session_id": "a1"}, headers=b), 404,
                    "session_not_found")
        check_error(httpx.post(f"{url}/v1/chat/completions", json={"messages": USER},
                               headers={**b, "X-Session-Id": "a1"}), 404, "session_not_found")
        # the owner's session is untouched: one call, and its reward and end are taken
        a = _as(KEYS["alice"])
        assert httpx.get(f"{url}/sessions/a1", headers=a).json()["calls"] == 1
        assert httpx.post(f"{url}/sessions/a1/reward", json={"reward": 1.0},
                          headers=a).status_code == 200
        assert httpx.post(f"{url}/sessions/a1/end", json={}, headers=a).json()["done"] is True
        # closed: still the owner's alone
        assert httpx.get(f"{url}/sessions/a1", headers=a).json()["done"] is True
        check_error(httpx.get(f"{url}/sessions/a1", headers=b), 404, "session_not_found")
        check_error(httpx.post(f"{url}/sessions/a1/v1/chat/completions",
                               json={"messages": USER}, headers=b), 404, "session_not_found")
        assert [e.owner for e in served.events("a1", "open")] == ["alice"]
    finally:
        served.stop()
        served.bus.close()


def test_idle_sessions_end_as_abandoned(rule_engine: Any, ascii_tokenizer: Any,
                                        tmp_path: Path) -> None:
    served = _serve(rule_engine(ascii_tokenizer, lambda p: "ok"), tmp_path,
                    idle_timeout_s=0.5, max_open_sessions=1)
    a = _as(KEYS["alice"])
    try:
        r = httpx.post(f"{served.url}/sessions/idle/v1/chat/completions",
                       json={"messages": USER}, headers=a, timeout=30)
        assert r.status_code == 200
        # full: a second session waits for the first to end
        full = httpx.post(f"{served.url}/sessions/other/v1/chat/completions",
                          json={"messages": USER}, headers=a, timeout=30)
        check_error(full, 429)
        deadline = time.monotonic() + 30  # a hang guard; the timeout is 0.5 s
        while not (info := httpx.get(f"{served.url}/sessions/idle", headers=a).json())["done"]:
            assert time.monotonic() < deadline, info
            time.sleep(0.05)
        assert (info["ended"], info["end_reason"], info["reward"]) == (True, "abandoned", None)
        (t,) = served.trajectories()
        assert (t.id, t.finish_reason, t.reward) == ("idle/default/0", "abandoned", 0.0)
        assert served.gw.metrics is not None
        assert served.gw.metrics.counters["sessions_abandoned"] == 1
        assert [e.reason for e in served.events("idle", "end")] == ["abandoned"]
        # its place is free
        again = httpx.post(f"{served.url}/sessions/other/v1/chat/completions",
                           json={"messages": USER}, headers=a, timeout=30)
        assert again.status_code == 200, again.text
    finally:
        served.stop()
        served.bus.close()


def test_a_session_with_a_call_running_is_not_abandoned(rule_engine: Any,
                                                        ascii_tokenizer: Any,
                                                        tmp_path: Path) -> None:
    import threading

    release = threading.Event()

    def slow(prompt: str) -> str:
        release.wait(30)
        return "ok"

    served = _serve(rule_engine(ascii_tokenizer, slow), tmp_path, idle_timeout_s=0.05)
    a = _as(KEYS["alice"])
    try:
        done: list[httpx.Response] = []
        caller = threading.Thread(target=lambda: done.append(httpx.post(
            f"{served.url}/sessions/busy/v1/chat/completions", json={"messages": USER},
            headers=a, timeout=60)))
        caller.start()
        deadline = time.monotonic() + 30
        while served.gw.inflight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # a sweep long past the timeout leaves it: its call is generating
        loop = served.gw.loop
        assert loop is not None
        import asyncio

        n = asyncio.run_coroutine_threadsafe(served.gw.expire(time.time() + 3600), loop)
        assert n.result(30) == 0
        release.set()
        caller.join(60)
        assert done and done[0].status_code == 200, done
        assert len(served.events("busy", "call")) == 1
    finally:
        release.set()
        served.stop()
        served.bus.close()


def test_exposure_without_a_token(caplog: pytest.LogCaptureFixture) -> None:
    for host in ("0.0.0.0", "192.168.1.4", "::", "gateway.example"):
        with pytest.raises(ConfigError, match="without a token"):
            check_exposure(host, authenticated=False, allow_unauthenticated=False)
        check_exposure(host, authenticated=True, allow_unauthenticated=False)
    with caplog.at_level(logging.WARNING, logger="astraflow.gateway.auth"):
        check_exposure("127.0.0.1", authenticated=False, allow_unauthenticated=False)
        check_exposure("0.0.0.0", authenticated=False, allow_unauthenticated=True)
    assert len([r for r in caplog.records if "has no token" in r.message]) == 2


def test_serve_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({
        "run": "gw", "policies": ["default"],
        "bus": {"url": "embedded://{out}/bus.db", "claims": None},
        "models": {"default": {"path": str(tmp_path / "no-model")}}}))
    env = {"ASTRAFLOW_LOG_LEVEL": "WARNING", "ASTRAFLOW_GATEWAY_TOKEN": ""}
    import os

    proc = subprocess.run([sys.executable, "-m", "astraflow.cli.app", "serve", str(config),
                           "--out", str(tmp_path / "run"), "--host", "0.0.0.0", "--port", "0"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "without a token" in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / "bus.db").exists()  # refused before opening anything
