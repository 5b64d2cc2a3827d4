"""Math answers checked with the ``math-verify`` package (LaTeX/boxed/plain expressions).

math-verify's own timeouts use ``signal.alarm``, which only works in a process's main thread;
rewards run in worker threads, so they are switched off here and the worker's reward timeout
bounds the call instead (a sympy computation that never ends keeps its thread busy until it
does; the episode is not held up).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.rewards.base import REWARDS


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        raise ImportError("the `math` reward needs math-verify: pip install 'math-verify>=0.7,<1'"
                          ) from None
    # it warns on every call made without its signal-based timeout
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return math_verify


@REWARDS.register("math")
def math_answer(completion: str, reference: Mapping[str, Any], *, key: str = "answer",
                float_rounding: int = 6) -> float:
    """1.0 if the completion's final answer is mathematically equal to ``reference[key]``."""
    mv = _math_verify()
    if key not in reference:
        raise KeyError(f"the task's reference has no {key!r} (it has {sorted(reference)})")
    gold_text = str(reference[key])
    if "$" not in gold_text and "\\boxed" not in gold_text:
        gold_text = f"${gold_text}$"
    gold = mv.parse(gold_text, parsing_timeout=None)
    if not gold:
        raise ValueError(f"cannot parse the reference answer {reference[key]!r}")
    answer = mv.parse(completion, parsing_timeout=None)
    if not answer:
        return 0.0
    return float(mv.verify(gold, answer, float_rounding=float_rounding, timeout_seconds=None))
