"""A bearer token in front of the gateway: with ``gateway.token`` (or
``$ASTRAFLOW_GATEWAY_TOKEN``) set, every request but ``GET /health`` must carry
``Authorization: Bearer <token>`` — what the OpenAI SDK sends for ``api_key=<token>`` — or
gets a 401 in OpenAI's error shape. A pure ASGI wrapper: no per-request cost beyond one
header comparison (constant time)."""

from __future__ import annotations

import hmac
import json
from typing import Any

from astraflow.gateway.errors import error_body

TOKEN_ENV = "ASTRAFLOW_GATEWAY_TOKEN"
OPEN_PATHS = frozenset({"/health"})

_REFUSED = json.dumps(error_body(
    "missing or wrong API key: this gateway takes `Authorization: Bearer <token>` (the "
    "OpenAI SDK's api_key); the token is gateway.token or $ASTRAFLOW_GATEWAY_TOKEN",
    code="invalid_api_key")).encode()


class BearerAuth:
    """ASGI middleware: refuses HTTP requests without the token (see the module docstring)."""

    def __init__(self, app: Any, token: str) -> None:
        if not token:
            raise ValueError("an empty gateway token would let anyone in; leave it unset")
        self.app = app
        self._want = b"Bearer " + token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        got = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                got = value
                break
        if hmac.compare_digest(got, self._want):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(_REFUSED)).encode())]})
        await send({"type": "http.response.body", "body": _REFUSED})
