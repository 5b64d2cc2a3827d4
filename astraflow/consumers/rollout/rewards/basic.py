"""Exact-match and numeric-match rewards against ``reference["answer"]``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.rewards.base import REWARDS, inline

_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d+)*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _answer(reference: Mapping[str, Any], key: str) -> str:
    if key not in reference:
        raise KeyError(f"the task's reference has no {key!r} (it has {sorted(reference)})")
    return str(reference[key])


def _normalise(text: str, case_sensitive: bool) -> str:
    text = " ".join(text.split())
    return text if case_sensitive else text.lower()


@REWARDS.register("exact_match")
@inline
def exact_match(completion: str, reference: Mapping[str, Any], *, key: str = "answer",
                strip: bool = True, case_sensitive: bool = True) -> float:
    """1.0 if the completion equals the answer (whitespace collapsed when ``strip``)."""
    want = _answer(reference, key)
    if strip:
        return float(_normalise(completion, case_sensitive) == _normalise(want, case_sensitive))
    return float(completion == want)


def last_number_text(text: str) -> str:
    """The last number written in ``text`` as written, commas and a sentence's final point
    dropped (``1,234.5`` -> ``1234.5``; ``is 7.`` -> ``7``; ``1e3`` kept), or "" (the
    ``last_number`` answer extractor's one rule)."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").removesuffix(".") if found else ""


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (``1,234.5`` and ``1e3`` understood), or None."""
    raw = last_number_text(text)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


@REWARDS.register("numeric_match")
@inline
def numeric_match(completion: str, reference: Mapping[str, Any], *, key: str = "answer",
                  rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
    """1.0 if the last number in the completion equals the numeric answer (within tolerance)."""
    want = last_number(_answer(reference, key))
    if want is None:
        raise ValueError(f"reference {key!r} = {reference[key]!r} is not a number")
    got = last_number(completion)
    return float(got is not None and math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol))
