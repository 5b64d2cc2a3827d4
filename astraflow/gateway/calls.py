"""From an OpenAI request to a :class:`~astraflow.gateway.service.CallSpec` and from the engine's
generations to OpenAI's answer: ``/v1/chat/completions`` and ``/v1/completions``.

Sampling defaults are the rollout engine's (``rollout.engine``: temperature, top_p,
max_new_tokens, stop, stop_token_ids), so an agent that sets nothing samples as a rollout
worker would; a request's fields override them. Fields that would change the distribution in
ways the engine cannot report exact behaviour logprobs for (penalties, top-k, min-p) are taken
at their neutral value only. Stop strings are trimmed from the text (OpenAI's behaviour;
``include_stop_str_in_output`` / ``no_stop_trim`` keep them) but always kept in the tokens.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from array import array
from collections.abc import Sequence
from typing import Any

from astraflow.consumers.rollout.engines.base import GenRequest, GenResult
from astraflow.core.records import ChatMessage
from astraflow.gateway.errors import GatewayError, bad_request, unsupported
from astraflow.gateway.messages import (
    CLOSE,
    new_call_id,
    parse_calls,
    span_role,
    to_chat,
    tool_text,
)
from astraflow.gateway.schemas import ChatRequest, CompletionRequest, Sampling
from astraflow.gateway.service import Built, CallSpec, Gateway
from astraflow.gateway.text import (
    chat_logprobs,
    completion_logprobs,
    hidden_tail,
    pieces,
    trim_stop,
)
from astraflow.models.prompt import appended_text, decode, encode, render_prompt

NEUTRAL = {"frequency_penalty": (0.0,), "presence_penalty": (0.0,), "top_k": (-1, 0),
           "min_p": (0.0,), "repetition_penalty": (1.0,)}


def _sampling(gw: Gateway, req: Sampling, max_tokens: int | None, sid: str | None
              ) -> tuple[int, dict[str, Any], list[str]]:
    """(n, the engine request's fields but the prompt, the client's stop strings); defaults:
    session ``sid``'s."""
    for name, ok in NEUTRAL.items():
        value = getattr(req, name)
        if value is not None and value not in ok:
            raise unsupported(name, value, f"only {ok[0]!r} (behaviour logprobs must be "
                                           "those of the sampling distribution)")
    n = req.n or 1
    if n > gw.max_n:
        raise bad_request(f"n={n} is more than this gateway samples at once "
                          f"(gateway.max_n={gw.max_n})", param="n", code="invalid_value")
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stops):
        raise bad_request("stop strings must not be empty", param="stop", code="invalid_value")
    d = gw.sampling_of(sid)
    fields = {"temperature": d["temperature"] if req.temperature is None else req.temperature,
              "top_p": d["top_p"] if req.top_p is None else req.top_p,
              "max_new_tokens": max_tokens or d["max_new_tokens"],
              "stop": (*d["stop"], *stops),
              "stop_token_ids": (*d["stop_token_ids"], *(req.stop_token_ids or ()))}
    return n, fields, stops


def _request(fields: dict[str, Any]) -> Any:
    def make(prompt: list[int]) -> GenRequest:
        return GenRequest(prompt_ids=prompt, **fields)
    return make


def _render(tokenizer: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(tokenizer, *args, **kwargs)
    except GatewayError:
        raise
    except Exception as e:  # noqa: BLE001 - a tokenizer or template refusing the text: the client's input
        raise bad_request(f"the prompt cannot be tokenized by this model's tokenizer: {e}",
                          param="messages", code="invalid_prompt") from None


class Renders:
    """A request's chat-template renderings: looked up in the gateway's byte-bounded cache
    (``gw.templates``: an episode's first turn is the same for every sample of its task, as
    rollout's Runtime caches them, and the chat template costs more than the rest of a call),
    rendered on a miss, and put in the cache only by :meth:`keep`, once the request has been
    served: a refused request (too long, full, malformed) leaves nothing behind."""

    def __init__(self, gw: Gateway, policy: str, tok: Any) -> None:
        self.cache, self.policy, self.tok = gw.templates, policy, tok
        self._new: list[tuple[tuple[str, bytes], array[int]]] = []

    def ids(self, msgs: Sequence[ChatMessage]) -> list[int]:
        key = (self.policy, _digest(msgs))
        hit = self.cache.get(key)
        if hit is not None:
            return hit.tolist()
        ids = _render(self.tok, render_prompt, list(msgs))[1]
        self._new.append((key, array("i", ids)))
        return list(ids)

    def keep(self) -> None:
        for key, ids in self._new:
            self.cache.put(key, ids)
        self._new.clear()


def _digest(msgs: Sequence[ChatMessage]) -> bytes:
    """A conversation's cache key: a 256-bit hash of its roles, texts and names (the cache
    holds no copy of a prompt's text)."""
    h = hashlib.blake2b(digest_size=32)
    for m in msgs:
        for part in (m.role, m.content, m.name or ""):
            raw = part.encode("utf-8", "surrogatepass")
            h.update(len(raw).to_bytes(8, "little"))
            h.update(raw)
        h.update(b"\x01" if m.name is not None else b"\x00")
    return h.digest()


def _tool_mode(req: ChatRequest) -> bool:
    """Whether the model may call tools (tools offered, tool_choice auto or absent)."""
    choice = req.tool_choice
    if choice is not None and choice not in ("auto", "none"):
        raise unsupported("tool_choice", choice, "auto or none (generation cannot be forced "
                                                  "into a call)")
    return bool(req.tools) and choice != "none"


def chat_spec(gw: Gateway, req: ChatRequest, sid: str | None = None) -> CallSpec:
    policy = gw.policy_for(req.model)
    tok = gw.engines[policy].tokenizer
    n, fields, stops = _sampling(gw, req, req.max_completion_tokens or req.max_tokens, sid)
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs",
                          code="invalid_value")
    tools = _tool_mode(req)
    names = [t.function.name for t in req.tools or ()]
    if tools:
        fields["stop"] = (*fields["stop"], CLOSE)
    msgs, offset = to_chat(req.messages, tools=req.tools, tools_prompt=gw.tools_prompt,
                           result_format=gw.tool_result_format)
    renders = Renders(gw, policy, tok)
    ids = renders.ids(msgs)
    gw.check_context(policy, ids)
    skip = req.skip_special_tokens is not False
    keep = bool(req.include_stop_str_in_output or req.no_stop_trim)
    model = req.model or policy

    def appended(k: int) -> tuple[list[int], str] | None:
        k += offset
        if len(msgs) <= k:
            return None
        text = _render(tok, appended_text, msgs[:k], msgs[k:])
        return _render(tok, encode, text, special=False), span_role(msgs[k:])

    def role(k: int) -> str:
        return span_role(msgs[k + offset:]) if len(msgs) > k + offset else "other"

    def reply(k: int) -> str | None:
        k += offset
        return msgs[k].content if len(msgs) > k and msgs[k].role == "assistant" else None

    def prefix(k: int) -> list[int]:
        return renders.ids(msgs[:k + offset])

    def build(prompt: list[int], results: list[GenResult]) -> Built:
        texts, hidden = _texts(tok, results, stops, skip=skip, keep=keep)
        choices, contents, served = [], [], []
        for i, (r, text) in enumerate(zip(results, texts, strict=True)):
            calls = parse_calls(text, names) if tools else None
            content = text if calls is None else calls[0]
            message: dict[str, Any] = {"role": "assistant", "content": content}
            finish: str = r.finish_reason
            if calls is not None:
                message["content"] = content or None
                message["tool_calls"] = [{"id": new_call_id(), "type": "function",
                                          "function": {"name": name, "arguments": args}}
                                         for name, args in calls[1]]
                finish = "tool_calls"
            # the message as a request that sends it back renders it (messages.to_chat)
            served.append(content + "".join(tool_text(name, args)
                                            for name, args in (calls[1] if calls else ())))
            choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": finish,
                                      "logprobs": None}
            if req.logprobs:
                choice["logprobs"] = {"content": chat_logprobs(tok, r.token_ids, r.logprobs,
                                                               req.top_logprobs or 0)}
            choices.append(choice)
            contents.append(content)
        built = _built(req, tok, skip, ("chat.completion", "chatcmpl", model), prompt,
                       results, choices, contents, hidden)
        built.texts = served
        return built

    return CallSpec("chat", policy, ids, n, _request(fields), build,
                    n_messages=len(req.messages), appended=appended, role=role, reply=reply,
                    prefix=prefix, keep=renders.keep)


def completion_spec(gw: Gateway, req: CompletionRequest, sid: str | None = None) -> CallSpec:
    policy = gw.policy_for(req.model)
    engine = gw.engines[policy]
    tok = engine.tokenizer
    n, fields, stops = _sampling(gw, req, req.max_tokens, sid)
    if req.echo:
        raise unsupported("echo", req.echo, "false only")
    if req.suffix is not None:
        raise unsupported("suffix", req.suffix, "null only")
    if req.best_of not in (None, 1):
        raise unsupported("best_of", req.best_of, "1 only (use n)")
    if isinstance(req.prompt, str):
        bos = getattr(tok, "bos_token", None)
        ids = _render(tok, encode, req.prompt,
                      special=not (bos and req.prompt.startswith(bos)))
    else:
        ids = list(req.prompt)
        vocab = max(len(tok), int(getattr(getattr(getattr(engine, "model", None), "config",
                                                  None), "vocab_size", 0) or 0))
        bad = [t for t in ids if not 0 <= t < vocab]
        if not ids or bad:
            raise bad_request(f"prompt token ids must be 1 or more ids in [0, {vocab}); got "
                              f"{bad[:5] if bad else 'none'}", param="prompt",
                              code="invalid_prompt")
    gw.check_context(policy, ids)
    skip = req.skip_special_tokens is not False
    keep = bool(req.include_stop_str_in_output or req.no_stop_trim)
    model = req.model or policy

    def build(prompt: list[int], results: list[GenResult]) -> Built:
        texts, hidden = _texts(tok, results, stops, skip=skip, keep=keep)
        choices = []
        for i, (r, text) in enumerate(zip(results, texts, strict=True)):
            choice: dict[str, Any] = {"index": i, "text": text,
                                      "finish_reason": r.finish_reason, "logprobs": None}
            if req.logprobs is not None:
                choice["logprobs"] = completion_logprobs(
                    tok, r.token_ids, r.logprobs, top=req.logprobs,
                    as_ids=bool(req.return_tokens_as_token_ids))
            choices.append(choice)
        built = _built(req, tok, skip, ("text_completion", "cmpl", model), prompt, results,
                       choices, texts, hidden)
        built.texts = texts
        return built

    def text_of(token_ids: list[int]) -> str:
        return decode(tok, token_ids, skip_special=False)

    def tokens_of(text: str) -> list[int]:
        return list(_render(tok, encode, text, special=False))

    return CallSpec("completions", policy, ids, n, _request(fields), build,
                    text=(text_of, tokens_of))


def _texts(tok: Any, results: Sequence[GenResult], stops: Sequence[str], *, skip: bool,
           keep: bool) -> tuple[list[str], list[int]]:
    """Each result's text (its stop string trimmed unless ``keep``) and how many of its
    trailing tokens the text leaves out."""
    texts, hidden = [], []
    for r in results:
        text = decode(tok, list(r.token_ids), skip_special=skip)
        text = text if keep else trim_stop(text, stops)
        texts.append(text)
        hidden.append(hidden_tail(tok, r.token_ids, text, skip_special=skip))
    return texts, hidden


def _built(req: ChatRequest | CompletionRequest, tok: Any, skip: bool, kind: tuple[str, str, str],
           prompt: list[int], results: Sequence[GenResult], choices: list[dict[str, Any]],
           texts: Sequence[str], hidden: list[int]) -> Built:
    """A route's answer: its ``choices`` (with their token ids when asked) in the body of
    ``kind`` (object, id prefix, model), and for a stream each choice's text (``texts``) in
    pieces, one per token."""
    if req.return_token_ids:
        for choice, r in zip(choices, results, strict=True):
            choice["token_ids"] = list(r.token_ids)
    body = _body(*kind, choices, prompt, results)
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt
    parts = [pieces(tok, r.token_ids, text, skip_special=skip)
             for r, text in zip(results, texts, strict=True)] if req.stream else []
    return Built(body, parts, hidden)


def _body(obj: str, prefix: str, model: str, choices: list[dict[str, Any]],
          prompt: Sequence[int], results: Sequence[GenResult]) -> dict[str, Any]:
    completion = sum(len(r.token_ids) for r in results)
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
            "model": model, "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                      "total_tokens": len(prompt) + completion}}
