"""Synthetic arithmetic tasks ``a<op>b=`` with the answer as reference (the quickstart's data).

The held-out split is a pure function of the problem: a hash of ``"a<op>b"`` puts
``test_fraction`` of all problems in ``test``, the rest in ``train``, so the splits never
overlap, whatever the seed, the count or the order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

from astraflow.core.records import ChatMessage
from astraflow.producers.sources import TaskSpec

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def split_of(problem: str, test_fraction: float) -> str:
    """``"test"`` or ``"train"`` for a problem such as ``"12+34"`` (deterministic)."""
    h = int.from_bytes(hashlib.blake2b(problem.encode(), digest_size=8).digest(), "big")
    return "test" if h / 2**64 < test_fraction else "train"


def problems(cfg: Any) -> list[tuple[int, str, int]]:
    """Every (a, op, b) of the configured split, in the seeded order."""
    out = []
    for op in cfg.ops:
        for a in range(cfg.min_value, cfg.max_value + 1):
            for b in range(cfg.min_value, cfg.max_value + 1):
                if split_of(f"{a}{op}{b}", cfg.test_fraction) == cfg.split:
                    out.append((a, op, b))
    random.Random(cfg.seed).shuffle(out)
    return out


def arithmetic(cfg: Any, *, dataset: str = "arith") -> Iterator[tuple[TaskSpec, int]]:
    """(task, repeat) pairs: ``cfg.count`` tasks (default: the split once), cycling through the
    split again (repeat + 1) when the count is larger than the split."""
    items = problems(cfg)
    if not items:
        return
    count = cfg.count if cfg.count is not None else len(items)
    for i in range(count):
        a, op, b = items[i % len(items)]
        problem = f"{a}{op}{b}"
        yield TaskSpec(id=f"{dataset}/{problem}",
                       prompt=[ChatMessage(role="user", content=f"{problem}=")],
                       reference={"answer": str(_OPS[op](a, b))},
                       metadata={"split": cfg.split}), i // len(items)
