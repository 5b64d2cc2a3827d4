"""A conversation in a tokenizer's chat format: the text and the token ids a model sees.

One implementation for every reader of prompts: the rollout worker renders a task's prompt
with :func:`render_prompt`, and the SFT demonstrations and the evaluator must render it
exactly the same way, or the model is trained or measured on a format it never samples in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astraflow.core.records import ChatMessage


def _dicts(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    out = []
    for m in messages:
        d = {"role": m.role, "content": m.content}
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out


def render(tokenizer: Any, messages: Sequence[ChatMessage], *, generation_prompt: bool) -> str:
    """The conversation as text: the tokenizer's chat template, or the contents concatenated
    when it has none."""
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(_dicts(messages), tokenize=False,
                                                 add_generation_prompt=generation_prompt))
    return "".join(m.content for m in messages)


def appended_text(tokenizer: Any, messages: Sequence[ChatMessage], new: Sequence[ChatMessage],
                  *, text: str | None = None) -> str:
    """The text that appending ``new`` to a conversation of ``messages`` adds, up to the
    generation prompt of the next assistant turn; only this text is tokenized when a
    conversation grows, so the tokens already there never change. ``text``: the conversation
    as the model saw and wrote it so far (the full rendering then starts with it when the
    template writes the generated turns as they were generated); otherwise the rendering of
    ``messages`` without a generation prompt is the prefix, and where even that is not a
    prefix (a template that changes earlier turns), ``new`` is rendered on its own."""
    full = render(tokenizer, [*messages, *new], generation_prompt=True)
    if text is not None and full.startswith(text):
        return full[len(text):]
    prev = render(tokenizer, messages, generation_prompt=False)
    return full[len(prev):] if full.startswith(prev) else render(tokenizer, new,
                                                                  generation_prompt=True)


def appended(tokenizer: Any, messages: Sequence[ChatMessage], new: Sequence[ChatMessage], *,
             text: str) -> tuple[str, list[int]]:
    """The text (:func:`appended_text`) and token ids that appending ``new`` to a
    conversation adds, as the rollout's conversations and the warm-up's demonstrations both
    append them."""
    delta = appended_text(tokenizer, messages, new, text=text)
    return delta, (encode(tokenizer, delta, special=False) if delta else [])


def encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    """Token ids of ``text``; through the fast tokenizer's backend when there is one (the
    ``__call__`` path costs several times more per call, which shows at thousands of episodes
    per second)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=special).ids)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


_PLAIN_DECODE: dict[type, bool] = {}


def _plain_decode(cls: type) -> bool:
    """Whether ``cls.decode`` is transformers' own fast-tokenizer decode (no subclass
    override), which is the backend's decode plus an optional clean-up of spaces."""
    ok = _PLAIN_DECODE.get(cls)
    if ok is None:
        dec, _dec = getattr(cls, "decode", None), getattr(cls, "_decode", None)
        ok = _PLAIN_DECODE[cls] = bool(
            dec is not None and _dec is not None
            and dec.__module__ == "transformers.tokenization_utils_base"
            and _dec.__module__ == "transformers.tokenization_utils_tokenizers")
    return ok


def decode(tokenizer: Any, ids: list[int], *, skip_special: bool) -> str:
    """The text of ``ids``, exactly as ``tokenizer.decode(ids, skip_special_tokens=...)``;
    straight through the fast tokenizer's backend when that is all ``decode`` would do (the
    wrapper costs several times the decode itself on short completions)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (backend is not None and getattr(tokenizer, "clean_up_tokenization_spaces", True) is False
            and _plain_decode(type(tokenizer))):
        try:
            return str(backend.decode(ids, skip_special_tokens=skip_special))
        except TypeError:  # ids the backend refuses (numpy scalars...): the wrapper converts
            pass
    return str(tokenizer.decode(ids, skip_special_tokens=skip_special))


def render_prompt(tokenizer: Any, messages: Sequence[ChatMessage]) -> tuple[str, list[int]]:
    """The text and token ids of a conversation's start, with the generation prompt (BOS added
    unless the chat template writes it)."""
    text = render(tokenizer, messages, generation_prompt=True)
    bos = getattr(tokenizer, "bos_token", None)
    return text, encode(tokenizer, text, special=not (bos and text.startswith(bos)))
