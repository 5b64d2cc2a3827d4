"""Config section ``gateway``: what ``astraflow serve`` listens on, how it records sessions and
how much it takes at once (docs/gateway.md has the long form).

The engine (type, model, device, default sampling) and weight following are the rollout
worker's (``rollout.engine``, ``rollout.weights``, ``weights``): the gateway samples exactly as
a worker would. Only pydantic here: :mod:`astraflow.config` imports this module, and
``astraflow --help`` loads that.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from astraflow.core.config import Section

DEFAULT_TOOLS_PROMPT = ('You can call a tool by writing <tool>NAME({"argument": value})</tool>; '
                        "its result comes back as <result>...</result>. Tools:\n{tools}\n")


class GatewayConfig(Section):
    """The OpenAI-compatible agent gateway (``astraflow serve``)."""

    host: str = pydantic.Field("127.0.0.1", description="address to listen on")
    port: int = pydantic.Field(8000, ge=0, le=65535, description="port (0: any free port)")
    token: str | None = pydantic.Field(
        None, description="bearer token every request but /health must carry (the OpenAI "
                          "SDK's api_key); default: $ASTRAFLOW_GATEWAY_TOKEN, else none")
    keys: dict[str, str] = pydantic.Field(
        default_factory=dict, description="client name -> API key: each client its own "
        "credential (its SDK's api_key); a session belongs to the client that opened it and "
        "is 404 to any other (holders of `token` are one client)")
    allow_unauthenticated: bool = pydantic.Field(
        False, description="serve a non-loopback host with neither token nor keys (refused "
        "otherwise: anyone who reaches it could use every session)")
    session_idle_timeout_s: float | None = pydantic.Field(
        900.0, gt=0, description="a session with no call, reward or end for this long (and no "
        "call running) is ended as abandoned: its trajectories are produced with finish_reason "
        "`abandoned` (not trained on) and it no longer counts against max_open_sessions; "
        "null: never")
    policies: list[str] | None = pydantic.Field(
        None, description="policies served (each a `model` name); default: rollout.policies, "
                          "else every policy of the run")
    aliases: dict[str, str] = pydantic.Field(
        default_factory=dict, description="extra `model` names -> policy, for harnesses "
                                          "that send a fixed model name (e.g. gpt-4o: solver)")
    on_drift: Literal["continue", "segment"] = pydantic.Field(
        "continue", description="a session's next prompt that does not extend the tokens "
        "recorded for it (an edited history, a template that re-renders a turn differently): "
        "continue: the recorded tokens plus the tokens of the newly added messages; segment: "
        "start a new segment (a separate trajectory) from the request as rendered")
    require_group: bool = pydantic.Field(
        True, description="refuse (400 missing_group) a session opened without a group id "
        "and a group size of 2 or more (X-Group-Id and X-Group-Size on its first call, or "
        "POST /sessions): the advantages are group-relative, so a group of one trains "
        "nothing; false: such sessions are recorded and their trajectories train nothing")
    max_open_sessions: int = pydantic.Field(
        256, ge=1, description="sessions not yet turned into trajectories; a request that "
        "would open another is answered 429 with Retry-After (the staleness budget: about "
        "(max_staleness + 1) x batch size of the run)")
    max_open_sessions_per_client: int | None = pydantic.Field(
        None, ge=1, description="open sessions one client (a key of gateway.keys; holders of "
        "the token, or everyone without one, are one client) may hold; more: 429 with "
        "Retry-After. Default: max_open_sessions shared evenly among gateway.keys (all of it "
        "with no keys), so one client cannot lock the others out")
    closed_session_retention_s: float | None = pydantic.Field(
        3600.0, gt=0, description="how long a closed session's id (and the answers of its "
        "reward and end, for retries) is remembered: a call to it until then is a 409, after "
        "it the id is free again; null: for ever (memory grows with every session)")
    max_inflight: int = pydantic.Field(
        256, ge=1, description="generation requests (each of n counts) at once; more: 429")
    retry_after_s: int = pydantic.Field(1, ge=1, description="Retry-After of a 429, seconds")
    max_n: int = pydantic.Field(16, ge=1, le=128, description="largest `n` of one request")
    context_length: int | None = pydantic.Field(
        None, ge=1, description="tokens of prompt + completion; a longer prompt is a 400 "
        "context_length_exceeded (default: the engine's model's max positions, if known)")
    tools_prompt: str = pydantic.Field(
        DEFAULT_TOOLS_PROMPT, description="the system message a request's `tools` become "
        "({tools}: one line per tool: name, description, JSON parameters); '' renders no "
        "tools message")
    tool_result_format: str = pydantic.Field(
        "<result>{output}</result>", description="how a `tool` message's content is rendered "
        "({output}: the content), as the multi_turn_tools workflow renders tool results")
    idempotency_cache: int = pydantic.Field(
        4096, ge=0, description="responses kept for Idempotency-Key retries of calls without "
        "a session (in memory; a session's are kept with it, durably), at most "
        "idempotency_cache_bytes of them")
    idempotency_cache_bytes: int = pydantic.Field(
        64 << 20, ge=0, description="bytes of responses kept for Idempotency-Key retries of "
        "calls without a session; the least recently used go first")
    template_cache_bytes: int = pydantic.Field(
        64 << 20, ge=0, description="bytes of rendered prompts (token ids) kept to skip the "
        "chat template for a conversation seen before (a task's first turn, again for each "
        "sample); only requests that were served are kept")
    metrics_interval: float = pydantic.Field(2.0, gt=0,
                                             description="seconds between heartbeats")
    # what one request or connection may cost (astraflow/gateway/limits.py, connections.py)
    max_body_bytes: int = pydantic.Field(
        4 << 20, ge=1024, description="largest request body, bytes; a larger one is a 413, "
        "refused before more of it is read")
    body_timeout_s: float = pydantic.Field(
        30.0, gt=0, description="seconds a request's body may take to arrive; slower: 408")
    max_messages: int = pydantic.Field(2048, ge=1,
                                       description="messages of one chat request; more: 400")
    max_message_chars: int = pydantic.Field(
        1 << 20, ge=1, description="characters of one message (or of a completion's text "
        "prompt); more: 400")
    max_tokenizing: int = pydantic.Field(
        2, ge=1, description="requests tokenized at once, each on its own thread (never on "
        "the event loop that answers /health and every other session)")
    max_tokenize_waiting: int = pydantic.Field(
        64, ge=0, description="requests waiting for a tokenizer thread; more: 429 with "
        "Retry-After")
    header_timeout_s: float = pydantic.Field(
        10.0, gt=0, description="seconds from a connection's start (or its next request's "
        "first byte) to the end of the request's headers; slower: the connection is closed")
    idle_timeout_s: float = pydantic.Field(
        5.0, gt=0, description="seconds a connection may stay idle between requests")
    max_header_bytes: int = pydantic.Field(
        16 << 10, ge=1024, description="largest request head (request line and headers), "
        "bytes; larger: 431 (400 while it is still arriving)")
    max_connections: int = pydantic.Field(
        1024, ge=1, description="open connections; more are closed at once. Lowered to "
        "leave 64 file descriptors of the process's limit (ulimit -n) to the rest")
    max_connections_per_peer: int = pydantic.Field(
        256, ge=1, description="open connections from one client address; its next ones are "
        "closed at once (one client holding sockets cannot take every connection; clients "
        "on the gateway's own host share 127.0.0.1)")
    allowed_hosts: list[str] = pydantic.Field(
        default_factory=list, description="host names, besides loopback ones (localhost, "
        "127.0.0.1, ::1), the gateway answers to in the Host header and in a browser's Origin "
        "('*': any); others: 403. Empty (the default): with no token or keys, loopback only "
        "(no cross-site page or DNS rebinding reaches it); with a credential, any")

    @pydantic.field_validator("tool_result_format")
    @classmethod
    def _output(cls, value: str) -> str:
        if "{output}" not in value:
            raise ValueError(f"{value!r} has no {{output}}: write where the tool's output goes, "
                             "e.g. '<result>{output}</result>'")
        return value
