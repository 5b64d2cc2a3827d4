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


def encode(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    """Token ids of ``text``; through the fast tokenizer's backend when there is one (the
    ``__call__`` path costs several times more per call, which shows at thousands of episodes
    per second)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return list(backend.encode(text, add_special_tokens=special).ids)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def render_prompt(tokenizer: Any, messages: Sequence[ChatMessage]) -> tuple[str, list[int]]:
    """The text and token ids of a conversation's start, with the generation prompt (BOS added
    unless the chat template writes it)."""
    text = render(tokenizer, messages, generation_prompt=True)
    bos = getattr(tokenizer, "bos_token", None)
    return text, encode(tokenizer, text, special=not (bos and text.startswith(bos)))
