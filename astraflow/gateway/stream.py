"""Server-sent events for ``stream: true``: a finished response as OpenAI's chunks, then
``data: [DONE]``.

The engine protocol returns a generation when it is complete, so a stream starts once the
call is generated and recorded; it carries the text in pieces (one per token where tokens
decode to it in order), then the logprobs, the tool calls and the finish reason of each choice,
and the usage when ``stream_options.include_usage`` is set.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgspec


def sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chat_chunks(body: dict[str, Any], pieces: Sequence[Sequence[str]] | None = None, *,
                usage: bool = False) -> Iterator[bytes]:
    """The chunks of a chat completion ``body``; ``pieces[i]``: choice i's content in pieces
    (default: in one)."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
            "model": body["model"]}
    extra = {"usage": None} if usage else {}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: Any = None) -> bytes:
        return sse({**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                         "finish_reason": finish}], **extra})

    for choice in body["choices"]:
        i, msg = choice["index"], choice["message"]
        yield chunk(i, {"role": "assistant", "content": ""})
        content = msg.get("content") or ""
        for piece in (pieces[i] if pieces is not None else [content]):
            if piece:
                yield chunk(i, {"content": piece})
        if choice.get("logprobs"):
            yield chunk(i, {}, logprobs=choice["logprobs"])
        calls = msg.get("tool_calls")
        if calls:
            yield chunk(i, {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]})
        yield chunk(i, {}, choice["finish_reason"])
    if usage:
        yield sse({**head, "choices": [], "usage": body["usage"]})
    yield DONE


def completion_chunks(body: dict[str, Any], pieces: Sequence[Sequence[str]] | None = None, *,
                      usage: bool = False) -> Iterator[bytes]:
    """The chunks of a text completion ``body`` (the same object type, ``text_completion``)."""
    head = {"id": body["id"], "object": "text_completion", "created": body["created"],
            "model": body["model"]}
    extra = {"usage": None} if usage else {}

    def chunk(index: int, text: str, finish: str | None = None, logprobs: Any = None) -> bytes:
        return sse({**head, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                         "finish_reason": finish}], **extra})

    for choice in body["choices"]:
        i = choice["index"]
        for piece in (pieces[i] if pieces is not None else [choice["text"]]):
            if piece:
                yield chunk(i, piece)
        yield chunk(i, "", choice["finish_reason"], choice.get("logprobs"))
    if usage:
        yield sse({**head, "choices": [], "usage": body["usage"]})
    yield DONE
