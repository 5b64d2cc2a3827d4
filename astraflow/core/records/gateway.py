"""The agent gateway's records: one event of a session per record (see
:mod:`astraflow.core.records` for the wire format)."""

from __future__ import annotations

import time
from typing import Literal

import msgspec

from astraflow.core.records.base import Record


class GatewayChoice(msgspec.Struct, kw_only=True):
    """One sampled completion of a gateway call (a call with ``n`` > 1 has several). Arrays
    align per generated token: ``token_ids`` <i4, ``logprobs`` <f4 (behaviour logprobs),
    ``versions`` <i4 (the policy version of the weights that produced each token)."""

    token_ids: bytes
    logprobs: bytes
    versions: bytes
    finish_reason: Literal["stop", "length"] = "stop"  # the engine's
    # trailing tokens that the text returned to the client leaves out (an EOS token, a stop
    # string trimmed): a next turn's rendered prompt may lack them and still continue this one
    hidden: int = 0
    # the text served for this choice, as a chat conversation writes it back (stop string
    # trimmed, before tool calls are parsed out; special tokens skipped unless asked): an
    # assistant message with exactly this text continues on ``token_ids``, however it
    # re-tokenizes. "": none recorded (an older record; only token matching applies)
    text: str = ""


class GatewayCall(Record, tag="GatewayCall", kw_only=True):
    """One event of an agent-gateway session (``astraflow serve``, :mod:`astraflow.gateway`).
    Key: ``session_id`` (a session's events stay in order on one partition). Written by the
    gateway, flushed before it answers the HTTP request; read by a restarted gateway, which
    rebuilds its open sessions from them, and by whoever audits what was served.

    ``kind``: ``open`` (the session's metadata), ``call`` (a completed chat or completion
    call: its exact tokens), ``reward``, ``end``, and ``done`` (its Trajectory records were
    produced; the session is closed). Fields a kind does not use keep their defaults.
    """

    session_id: str
    seq: int  # the event's number within its session, from 0, in produce order
    kind: Literal["open", "call", "reward", "end", "done"]
    policy: str = ""  # call: the policy that generated
    # open: where the session's trajectories go (defaults: a group of one named after it)
    task_id: str = ""
    group_id: str = ""
    sample_index: int = 0
    group_size: int = 1
    agent: str = ""
    metadata: dict[str, str] = {}
    # open: the client that opened the session (a name of ``gateway.keys``; "": the shared
    # token, or none): only it may use the session
    owner: str = ""
    # call, reward, end: the client's Idempotency-Key, scoped by route ("chat:KEY",
    # "completions:KEY", "reward:KEY", "end:KEY"); "": none
    call_id: str = ""
    route: Literal["", "chat", "completions"] = ""
    segment: int = 0  # the trajectory (per policy) this call belongs to
    parent: int = -1  # seq of the call whose prompt + completion this one's prompt extends
    parent_choice: int = 0  # which of the parent's choices it extends
    # the prompt tokens after the parent's prompt + completion (the whole prompt when parent
    # is -1), <i4; and the span role they get in the trajectory ("prompt", "tool", "user", ...)
    prompt_ids: bytes = b""
    prompt_role: str = "prompt"
    prompt_len: int = 0  # tokens of the whole prompt
    n_messages: int = 0  # chat: messages in the request
    drift: bool = False  # the request's history did not extend the recorded tokens
    branch: bool = False  # the request went back to an earlier call of its chain
    # The client's view of the conversation (what its next turns' renderings extend) where it
    # differs from the recorded tokens: ``view_drop``, the parent's trailing hidden tokens
    # the request's rendering leaves out (an EOS the chat template does not write back);
    # ``view_ids`` (<i4), after a drift continued on the recorded tokens, the request as
    # rendered (b"": the view is the parent's view, its completion and ``prompt_ids``)
    view_drop: int = 0
    view_ids: bytes = b""
    choices: list[GatewayChoice] = []
    response: bytes = b""  # the JSON body answered (replayed for a retried Idempotency-Key)
    reward: float = 0.0  # reward
    rewards: dict[str, float] = {}  # reward: named components; absent: only ``reward``
    # end: why the session ended: "" (its client ended it), "abandoned" (idle past
    # gateway.session_idle_timeout_s; its trajectories get finish_reason "abandoned")
    reason: Literal["", "abandoned"] = ""
    created_at: float = msgspec.field(default_factory=time.time)
