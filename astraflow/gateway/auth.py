"""Who may call the gateway, and who owns a session.

With ``gateway.token`` (or ``$ASTRAFLOW_GATEWAY_TOKEN``) and/or ``gateway.keys`` (client name
-> key) set, every request but ``GET /health`` must carry ``Authorization: Bearer
<credential>`` (the SDK's ``api_key``, compared in constant time) or gets a 401. A pure ASGI
wrapper; it puts the request's client in ``scope["state"]["client"]``: its key's name, or
``""`` for the shared token. A session belongs to the client that opened it; others get 404.
:func:`check_exposure` refuses a non-loopback address with no credential. See docs/gateway.md.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import Mapping
from typing import Any

from astraflow.core.errors import ConfigError
from astraflow.gateway.errors import error_body

log = logging.getLogger("astraflow.gateway.auth")

TOKEN_ENV = "ASTRAFLOW_GATEWAY_TOKEN"
OPEN_PATHS = frozenset({"/health"})
AUTHENTICATED = "authenticated"  # scope["state"] key: the request carried a credential
SHARED = ""  # the client name of the shared token (and of every caller without credentials)

_REFUSED = json.dumps(error_body(
    "missing or wrong API key: this gateway takes `Authorization: Bearer <key>` (the "
    "OpenAI SDK's api_key); a key is gateway.token, $ASTRAFLOW_GATEWAY_TOKEN or one of "
    "gateway.keys", code="invalid_api_key")).encode()


def credentials(token: str | None, keys: Mapping[str, str] | None = None) -> dict[str, str]:
    """Credential -> client name: the shared ``token`` (name ``""``) and each of ``keys``
    (name -> key). Empty or repeated credentials are refused."""
    out: dict[str, str] = {}
    if token is not None:
        if not token:
            raise ValueError("an empty gateway token would let anyone in; leave it unset")
        out[token] = SHARED
    for name, key in (keys or {}).items():
        if not name or not key:
            raise ValueError(f"gateway.keys: {name!r} needs a non-empty name and key")
        if key in out:
            raise ValueError(f"gateway.keys: the key of {name!r} is also another client's "
                             "(or the token); give each client its own")
        out[key] = name
    return out


class BearerAuth:
    """ASGI middleware: refuses HTTP requests without a credential, and names the client of
    the others (see the module docstring)."""

    def __init__(self, app: Any, token: str | None = None,
                 keys: Mapping[str, str] | None = None) -> None:
        creds = credentials(token, keys)
        if not creds:
            raise ValueError("an empty gateway token would let anyone in; leave it unset")
        self.app = app
        self._want = [(b"Bearer " + k.encode(), name) for k, name in creds.items()]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        got = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                got = value
                break
        client = None
        for want, who in self._want:  # every one compared: no timing hint of which matched
            if hmac.compare_digest(got, want):
                client = who
        if client is not None:
            state = scope.setdefault("state", {})
            state["client"], state[AUTHENTICATED] = client, True
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(_REFUSED)).encode())]})
        await send({"type": "http.response.body", "body": _REFUSED})


def authenticated(scope: Mapping[str, Any]) -> bool:
    """Whether the request of ``scope`` carried one of its gateway's credentials."""
    return bool(scope.get("state", {}).get(AUTHENTICATED))


def protect(app: Any, token: str | None = None, keys: Mapping[str, str] | None = None) -> Any:
    """``app`` behind :class:`BearerAuth` when any credential is set; ``app`` itself when none."""
    if token is not None or keys:
        app.add_middleware(BearerAuth, token=token, keys=dict(keys or {}))
    return app


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is this machine's loopback."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_exposure(host: str, *, authenticated: bool, allow_unauthenticated: bool) -> None:
    """Refuse to serve ``host`` (not a loopback address) with no credential unless
    ``allow_unauthenticated``; warn once when serving without one."""
    if authenticated:
        return
    if not is_loopback(host) and not allow_unauthenticated:
        raise ConfigError(
            f"refusing to serve the gateway on {host} without a token: anyone who can reach "
            "it could read, reward and end sessions. Set gateway.token (or "
            f"${TOKEN_ENV}) or gateway.keys, listen on 127.0.0.1, or set "
            "gateway.allow_unauthenticated: true on a network you trust")
    log.warning("the gateway on %s has no token: every local user and process can call it "
                "and use any session; set gateway.token or gateway.keys", host)
