"""The HTTP API (FastAPI): OpenAI's routes under ``/v1`` and under ``/sessions/{id}/v1``, the
session routes, and every error in OpenAI's shape.

OpenAI's routes (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``) are served
under ``/sessions/{session_id}/v1`` (an SDK's ``base_url``), or under ``/v1`` with an
``X-Session-Id`` header; without a session a call is served, not recorded. Session routes:
``POST /sessions``, ``GET /sessions/{id}``, ``POST /sessions/{id}/reward`` and ``/end``.
Errors have the body ``{"error": {message, type, param, code}}``. Routes, headers and status
codes: docs/gateway.md.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

import astraflow
from astraflow.gateway.auth import protect
from astraflow.gateway.calls import chat_spec, completion_spec
from astraflow.gateway.errors import GatewayError, error_body
from astraflow.gateway.guards import HostCheck
from astraflow.gateway.limits import BodyLimit, Limits, Tokenizing, check_messages, check_prompt
from astraflow.gateway.schemas import (
    MAX_INT,
    ChatCompletion,
    ChatRequest,
    Completion,
    CompletionRequest,
    EndRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    RewardRequest,
    SessionInfo,
    SessionRequest,
)
from astraflow.gateway.service import Gateway, Reply
from astraflow.gateway.store import check_session_id
from astraflow.gateway.stream import chat_chunks, completion_chunks

log = logging.getLogger("astraflow.gateway.app")

INTEGER = re.compile(r"[+-]?[0-9]+")
SessionPath = Annotated[str, Path(description="the session: created on first use")]
Key = Annotated[str | None, Header(alias="Idempotency-Key", max_length=256,
                                   description="a retry with the same key is answered the "
                                               "recorded response, recorded once")]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: {"model": ErrorResponse} for c in codes}


def _streamed(model: type) -> dict[int | str, dict[str, Any]]:
    return {200: {"model": model, "content": {"text/event-stream": {
        "schema": {"type": "string"}}}}}


@dataclass
class Meta:
    """A call's session (``X-Session-Id``), the metadata of a session it opens, its
    ``Idempotency-Key``, and its client (:func:`client_of`)."""

    sid: str | None
    meta: dict[str, Any]
    key: str | None = None
    owner: str = ""
    body: bytes = b""  # the request's body, when it carries an Idempotency-Key


def new_session_id() -> str:
    """A session id no one can guess: 128 bits from the OS's CSPRNG, as 32 hex digits."""
    return secrets.token_hex(16)


def client_of(request: Request) -> str:
    """The client named by the request's credential (``""``: the shared token, or none)."""
    return str(request.scope.get("state", {}).get("client", ""))


#: the headers of a call: (name, JSON schema, description)
HEADERS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("X-Session-Id", {"type": "string"}, "the session (instead of /sessions/{id}/v1)"),
    ("X-Task-Id", {"type": "string"}, "a session's task (on its first call)"),
    ("X-Group-Id", {"type": "string"}, "a session's group (on its first call)"),
    ("X-Sample-Index", {"type": "integer", "minimum": 0}, "a session's sample index"),
    ("X-Group-Size", {"type": "integer", "minimum": 1}, "a session's group size"),
    ("X-Agent", {"type": "string"}, "a session's role"),
    ("Idempotency-Key", {"type": "string", "maxLength": 256},
     "a retry with the same key is answered the recorded response, recorded once"),
)
#: the headers documented on the routes that read them (:func:`_meta` reads them by hand)
HEADER_DOCS = {"parameters": [{"name": n, "in": "header", "required": False, "schema": schema,
                               "description": d} for n, schema, d in HEADERS]}


def _invalid(name: str, kind: str, msg: str, value: str) -> RequestValidationError:
    return RequestValidationError([{"type": kind, "loc": ("header", name), "msg": msg,
                                    "input": value}])


def _int_header(headers: Any, name: str, low: int) -> int | None:
    """The header ``name`` as an integer in [``low``, :data:`MAX_INT`] (None if absent); a
    400 naming the header otherwise. Only ASCII digits (and a sign) are an integer here:
    Python's ``int`` would take ``1_000``, spaces and other scripts' digits too."""
    raw = headers.get(name)
    if raw is None:
        return None
    if not INTEGER.fullmatch(raw):
        raise _invalid(name, "int_parsing", "Input should be a valid integer, unable to parse "
                       "string as an integer", raw[:40])
    value = int(raw) if len(raw) <= 20 else (MAX_INT + 1) * (-1 if raw[0] == "-" else 1)
    if value < low:
        raise _invalid(name, "greater_than_equal",
                       f"Input should be greater than or equal to {low}", raw[:40])
    if value > MAX_INT:
        raise _invalid(name, "less_than_equal",
                       f"Input should be less than or equal to {MAX_INT}", raw[:40])
    return value


async def _meta(request: Request) -> Meta:
    """The call's headers (:data:`HEADERS`), read in one go: FastAPI's per-header parameters
    cost more than the rest of the request's routing (measured: bench/gateway.py)."""
    h = request.headers
    key = h.get("idempotency-key")
    if key is not None and len(key) > 256:
        raise _invalid("Idempotency-Key", "string_too_long",
                       "String should have at most 256 characters", key)
    sid = h.get("x-session-id")
    meta = {"task_id": h.get("x-task-id"), "group_id": h.get("x-group-id"),
            "sample_index": _int_header(h, "X-Sample-Index", 0),
            "group_size": _int_header(h, "X-Group-Size", 1), "agent": h.get("x-agent")}
    body = await request.body() if key else b""  # read already: the route's body parameter
    return Meta(None if sid is None else check_session_id(sid), meta, key, client_of(request),
                body)


MetaDep = Annotated[Meta, Depends(_meta)]


def create_app(gw: Gateway, *, token: str | None = None,
               keys: dict[str, str] | None = None, limits: Limits | None = None) -> FastAPI:
    """The ASGI app over ``gw``; its lifespan starts it (rebuilding sessions) and closes it.
    ``token`` (shared) and ``keys`` (client name -> key): every request but ``/health`` must
    carry one as a bearer token (:mod:`astraflow.gateway.auth`); ``limits``: what one request
    may cost (:mod:`astraflow.gateway.limits`)."""
    limits = limits or Limits()
    tokenizing = Tokenizing(limits.max_tokenizing, limits.max_tokenize_waiting,
                            limits.retry_after_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            tokenizing.close()
            await gw.aclose()

    app = FastAPI(title="AstraFlow agent gateway", version=astraflow.__version__,
                  lifespan=lifespan, description=__doc__)
    _handlers(app, gw)
    for prefix, session in (("/v1", False), ("/sessions/{session_id}/v1", True)):
        _v1(app, gw, prefix, session, limits, tokenizing)
    _sessions(app, gw)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes,  # inside auth (added last)
                       timeout_s=limits.body_timeout_s,
                       on_reject=lambda status: gw.count(f"errors.{status}"))
    # outside the body's limit: a refused Host or Origin has its body never read; inside
    # auth, which tells it whether the request carried a credential
    app.add_middleware(HostCheck, allowed=limits.allowed_hosts)
    return protect(app, token=token, keys=keys)


def _answer(reply: Reply, stream: bool | None, chunks: Any, usage: bool) -> Response:
    if stream:
        return StreamingResponse(chunks(reply.body, reply.pieces, usage=usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return Response(reply.raw, media_type="application/json")


async def _sid_of_path(session_id: SessionPath) -> str:
    return check_session_id(session_id)


async def _sid_of_header(meta: MetaDep) -> str | None:
    return meta.sid


SidOfPath = Annotated[str | None, Depends(_sid_of_path)]
SidOfHeader = Annotated[str | None, Depends(_sid_of_header)]


def _v1(app: FastAPI, gw: Gateway, prefix: str, session: bool, limits: Limits,
        tokenizing: Tokenizing) -> None:
    """OpenAI's routes under ``prefix``; the session comes from the path (``session``) or
    the ``X-Session-Id`` header. Requests are checked against ``limits`` and tokenized on
    ``tokenizing``'s threads."""
    tag = "session" if session else "v1"
    suffix = "_in_session" if session else ""

    async def chat(body: ChatRequest, meta: MetaDep, sid: SidOfHeader) -> Response:
        check_messages(body.messages, limits)
        spec = await tokenizing.run(chat_spec, gw, body, sid)
        reply = await gw.call(spec, sid=sid, meta=meta.meta, key=meta.key, owner=meta.owner,
                              offload=tokenizing.run, request=meta.body)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _answer(reply, body.stream, chat_chunks, usage)

    async def completions(body: CompletionRequest, meta: MetaDep, sid: SidOfHeader) -> Response:
        check_prompt(body.prompt, limits)
        spec = await tokenizing.run(completion_spec, gw, body, sid)
        reply = await gw.call(spec, sid=sid, meta=meta.meta, key=meta.key, owner=meta.owner,
                              offload=tokenizing.run, request=meta.body)
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return _answer(reply, body.stream, completion_chunks, usage)

    async def models(sid: SidOfHeader) -> dict[str, Any]:
        return {"object": "list", "data": [_card(gw, p) for p in gw.policies]}

    async def model(model: str, sid: SidOfHeader) -> dict[str, Any]:
        gw.policy_for(model)
        return _card(gw, model)

    for fn in (chat, completions, models, model):  # the session: from the path, or a header
        fn.__annotations__["sid"] = SidOfPath if session else SidOfHeader
    errors = _errors(400, 404, 409, 413, 429, 500)
    read = {} if session else HEADER_DOCS  # the GET routes read the headers for X-Session-Id
    app.post(f"{prefix}/chat/completions", tags=[tag], operation_id=f"chat{suffix}",
             responses={**_streamed(ChatCompletion), **errors}, openapi_extra=HEADER_DOCS)(chat)
    app.post(f"{prefix}/completions", tags=[tag], operation_id=f"completions{suffix}",
             responses={**_streamed(Completion), **errors}, openapi_extra=HEADER_DOCS
             )(completions)
    app.get(f"{prefix}/models", tags=[tag], operation_id=f"models{suffix}",
            response_model=ModelList, responses=_errors(400), openapi_extra=read)(models)
    app.get(f"{prefix}/models/{{model}}", tags=[tag], operation_id=f"model{suffix}",
            response_model=ModelCard, responses=_errors(400, 404), openapi_extra=read)(model)


def _card(gw: Gateway, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": gw.created, "owned_by": "astraflow"}


def _sessions(app: FastAPI, gw: Gateway) -> None:
    @app.post("/sessions", tags=["sessions"], status_code=201, response_model=SessionInfo,
              responses=_errors(400, 404, 409, 429))
    async def open_session(request: Request, body: SessionRequest | None = None
                           ) -> dict[str, Any]:
        """Open a session with its metadata (where its trajectories go); answers an existing
        one with the same metadata, 409 with other metadata."""
        body = body or SessionRequest.model_validate({})
        sid = body.session_id or new_session_id()
        meta = body.model_dump(exclude={"session_id"})
        s, _ = await gw.store.open(sid, meta, same_meta=True, owner=client_of(request))
        return gw.store.info(s)

    @app.get("/sessions/{session_id}", tags=["sessions"], response_model=SessionInfo,
             responses=_errors(400, 404))
    async def session_info(session_id: SessionPath, request: Request) -> dict[str, Any]:
        return gw.store.info_of(session_id, client_of(request))

    @app.post("/sessions/{session_id}/reward", tags=["sessions"], response_model=SessionInfo,
              responses=_errors(400, 404, 409))
    async def reward(session_id: SessionPath, body: RewardRequest, request: Request,
                     key: Key = None) -> Response:
        raw = await gw.reward(session_id, body.reward, body.rewards, key=key,
                              owner=client_of(request))
        return Response(raw, media_type="application/json")

    @app.post("/sessions/{session_id}/end", tags=["sessions"], response_model=SessionInfo,
              responses=_errors(400, 404, 409))
    async def end(session_id: SessionPath, request: Request, body: EndRequest | None = None,
                  key: Key = None) -> Response:
        body = body or EndRequest.model_validate({})
        raw = await gw.end(session_id, body.reward, body.rewards, key=key,
                           owner=client_of(request))
        return Response(raw, media_type="application/json")

    @app.get("/health", tags=["sessions"])
    async def health() -> dict[str, Any]:
        return {"status": "ok", "versions": {p: e.version for p, e in gw.engines.items()},
                "open_sessions": gw.store.open_count, "inflight": gw.inflight}


def _handlers(app: FastAPI, gw: Gateway) -> None:
    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, e: GatewayError) -> JSONResponse:
        gw.count(f"errors.{e.status}")
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        gw.count("errors.400")
        errs = e.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request", "type": ""}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "header", "path")]
        param = ".".join(loc) or None
        kind = first.get("type", "")
        if kind == "json_invalid":
            param = None
            msg, code = f"the body is not valid JSON: {first.get('msg')}", "invalid_json"
        elif kind == "missing" and not loc:
            msg, code = "the request needs a JSON body", "invalid_value"
        elif kind == "extra_forbidden":
            msg, code = f"Unrecognized request argument supplied: {param}", "unknown_parameter"
        else:
            msg, code = f"{param or 'body'}: {first.get('msg')}", "invalid_value"
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        return JSONResponse(error_body(msg + more, param=param, code=code), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, e: HTTPException) -> JSONResponse:
        gw.count(f"errors.{e.status_code}")
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), type=kind), status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def crash(_: Request, e: Exception) -> JSONResponse:
        gw.count("errors.500")
        log.exception("request failed: %s", e)
        return JSONResponse(error_body(f"internal error: {type(e).__name__}: {e}",
                                       type="server_error"), status_code=500)

