"""Generated tokens as the text a client gets: stop strings trimmed as OpenAI does, which
trailing tokens the text leaves out, stream pieces, and logprob entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astraflow.models.prompt import decode

MAX_TAIL_SCAN = 64  # tokens looked back for where the returned text ends
MAX_PIECE_TOKENS = 512  # longer outputs stream in fixed-size text pieces


def trim_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first stop string in it (the engine keeps it; OpenAI does not)."""
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def hidden_tail(tokenizer: Any, ids: Sequence[int], text: str, *, skip_special: bool) -> int:
    """How many trailing tokens of ``ids`` the returned ``text`` leaves out: an EOS token
    (decoded to nothing), a trimmed stop string. 0 when the tokens up to some point decode to
    exactly ``text`` nowhere near the end (a stop string that began inside a token)."""
    ids = list(ids)
    best = None
    for j in range(len(ids), max(-1, len(ids) - MAX_TAIL_SCAN - 1), -1):
        got = decode(tokenizer, ids[:j], skip_special=skip_special)
        if got == text:
            best = j
        elif best is not None or len(got) < len(text):
            break
    return 0 if best is None else len(ids) - best


def pieces(tokenizer: Any, ids: Sequence[int], text: str, *, skip_special: bool) -> list[str]:
    """``text`` cut into stream pieces, one per token where tokens decode to it in order;
    their concatenation is ``text``."""
    out: list[str] = []
    if len(ids) <= MAX_PIECE_TOKENS:
        prev, done = "", 0
        for j in range(1, len(ids) + 1):
            if done >= len(text):
                break
            cur = decode(tokenizer, list(ids[:j]), skip_special=skip_special)
            if not cur.startswith(prev):
                break
            piece = cur[len(prev):][:len(text) - done]
            if not text.startswith(piece, done):
                break
            out.append(piece)
            done += len(piece)
            prev = cur
    rest = text[sum(map(len, out)):]
    step = 64
    out += [rest[i:i + step] for i in range(0, len(rest), step)]
    return [p for p in out if p]


def token_text(tokenizer: Any, token: int) -> str:
    return decode(tokenizer, [token], skip_special=False)


def chat_logprobs(tokenizer: Any, ids: Sequence[int], logprobs: Sequence[float],
                  top: int) -> list[dict[str, Any]]:
    """Chat ``logprobs.content`` entries, one per generated token. The engine gives the
    sampled token's logprob only, so ``top_logprobs`` holds at most that one."""
    out = []
    for t, lp in zip(ids, logprobs, strict=True):
        s = token_text(tokenizer, t)
        entry = {"token": s, "logprob": lp, "bytes": list(s.encode())}
        out.append({**entry, "top_logprobs": [entry] if top > 0 else []})
    return out


def completion_logprobs(tokenizer: Any, ids: Sequence[int], logprobs: Sequence[float], *,
                        top: int, as_ids: bool) -> dict[str, Any]:
    """Completion ``logprobs``: tokens (``token_id:N`` with ``as_ids``), their logprobs, the
    sampled one as the only top logprob (when ``top`` > 0), and text offsets."""
    tokens = [f"token_id:{t}" if as_ids else token_text(tokenizer, t) for t in ids]
    offsets, pos = [], 0
    for t in ids:
        offsets.append(pos)
        pos += len(token_text(tokenizer, t))
    return {"tokens": tokens, "token_logprobs": list(logprobs),
            "top_logprobs": ([{k: lp} for k, lp in zip(tokens, logprobs, strict=True)]
                             if top > 0 else None),
            "text_offset": offsets}
