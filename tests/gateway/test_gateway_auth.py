"""A gateway with a token refuses requests without it (401, OpenAI's error shape), lets the
official SDK in with ``api_key=<token>``, and leaves ``/health`` open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_helpers import check_error

from astraflow.core.bus import connect
from astraflow.core.topics import run_topics
from astraflow.gateway.app import create_app
from astraflow.gateway.auth import BearerAuth
from astraflow.gateway.server import ServerThread
from astraflow.gateway.service import Gateway
from astraflow.gateway.store import SessionStore

TOKEN = "s3cret-token"


def test_requests_without_the_token_are_refused(ascii_engine: Any, tmp_path: Path) -> None:
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    gw = Gateway({"default": ascii_engine}, SessionStore(bus, run="r"),
                 sampling={"max_new_tokens": 4})
    srv = ServerThread(create_app(gw, token=TOKEN)).start()
    try:
        body = {"model": "default", "messages": [{"role": "user", "content": "hi"}]}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                        {"Authorization": f"Basic {TOKEN}"}):
            for path in ("/v1/chat/completions", "/sessions/s1/v1/chat/completions",
                         "/sessions/s1/reward"):
                r = httpx.post(f"{srv.url}{path}", json=body, headers=headers, timeout=30)
                check_error(r, 401, "invalid_api_key")
                assert r.headers["www-authenticate"] == "Bearer"
            check_error(httpx.get(f"{srv.url}/v1/models", headers=headers, timeout=30), 401,
                        "invalid_api_key")
        assert httpx.get(f"{srv.url}/health", timeout=30).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{srv.url}/v1", api_key="wrong",
                          max_retries=0).models.list()
        client = openai.OpenAI(base_url=f"{srv.url}/sessions/s1/v1", api_key=TOKEN,
                               max_retries=0)
        r = client.chat.completions.create(model="default", messages=body["messages"])
        assert r.choices[0].message.content is not None
        # nothing the refused requests asked for was recorded: one call, by the SDK
        assert len(gw.store.get("s1").calls) == 1  # type: ignore[union-attr]
    finally:
        srv.stop()
        bus.close()


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="empty gateway token"):
        BearerAuth(lambda *a: None, "")
