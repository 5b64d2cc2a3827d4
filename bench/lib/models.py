"""The tiny models the benchmarks build and save (:mod:`astraflow.models.tiny`, seed 0 unless
said): one function, so that the scripts do not each carry a copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_model(root: Path, tokenizer: str = "arith", name: str | None = None,
               **shape: Any) -> Path:
    """A tiny Qwen2 over ``tokenizer`` (``arith``, ``ascii``, …) saved in ``root / name``
    (``tiny-<tokenizer>`` by default); ``shape``: :func:`astraflow.models.tiny.build_model`'s
    keywords (``hidden``, ``layers``, ``max_positions``, ``seed``, …). Its directory."""
    from astraflow.models.tiny import build_model, build_tokenizer, save

    tok = build_tokenizer(tokenizer)
    return save(build_model(tok, **{"seed": 0, **shape}), tok,
                root / (name or f"tiny-{tokenizer}"))
