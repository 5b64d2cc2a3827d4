"""Answer extraction: ``rollout.reward.extract`` names a function ``text -> text`` applied to
the completion before the reward sees it (the trajectory keeps the whole completion; only the
reward sees the extracted answer).

Registered: ``none`` (the completion as is), ``last_number``, ``first_word``, ``first_line``,
``last_line``, ``answer_tag`` (inside the last ``<answer>...</answer>``), ``boxed`` (inside the
last ``\\boxed{...}``); or a user's ``module.path:function``. An extractor that finds nothing
returns ``""``, which the rewards score as a wrong answer.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from astraflow.consumers.rollout.rewards.base import RewardFn
from astraflow.consumers.rollout.rewards.basic import last_number_text
from astraflow.core.registry import Registry

Extractor = Callable[[str], str]
EXTRACTORS: Registry[Extractor] = Registry("answer extractor")

_LEAD = "\"'`*_([{<«“‘"
_TRAIL = ".,;:!?\"'`*_)]}>»”’"
_OPEN, _CLOSE = "<answer>", "</answer>"


@EXTRACTORS.register("none")
def none(text: str) -> str:
    """The completion as is."""
    return text


@EXTRACTORS.register("last_number")
def last_number(text: str) -> str:
    """The last number written (commas removed: ``1,234.5`` → ``1234.5``), read as
    ``numeric_match`` reads a completion."""
    return last_number_text(text)


@EXTRACTORS.register("first_word")
def first_word(text: str) -> str:
    """The first word, without the punctuation around it (``"Yes."`` → ``Yes``; a sign stays:
    ``-5,`` → ``-5``)."""
    for word in text.split():
        word = word.lstrip(_LEAD).rstrip(_TRAIL)
        if word:
            return word
    return ""


@EXTRACTORS.register("first_line")
def first_line(text: str) -> str:
    """The first line that is not blank, stripped."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


@EXTRACTORS.register("last_line")
def last_line(text: str) -> str:
    """The last line that is not blank, stripped."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


@EXTRACTORS.register("answer_tag")
def answer_tag(text: str) -> str:
    """The text inside the last ``<answer>...</answer>`` (stripped); a last tag left open
    (generation stopped at ``</answer>``) runs to the end."""
    start = text.rfind(_OPEN)
    if start < 0:
        return ""
    inner = text[start + len(_OPEN):]
    end = inner.find(_CLOSE)
    return (inner if end < 0 else inner[:end]).strip()


@EXTRACTORS.register("boxed")
def boxed(text: str) -> str:
    """The content of the last ``\\boxed{...}`` (braces inside balanced), stripped."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return ""
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return ""  # unbalanced: the box never closed


def check_extractor(name: str) -> str:
    """``name`` if it is registered or has the ``module.path:function`` form; else ValueError
    listing the valid names (a config validator; nothing is imported)."""
    if name in EXTRACTORS or (":" in name and all(name.partition(":")[::2])):
        return name
    raise ValueError(f"unknown answer extractor {name!r}; valid: {', '.join(EXTRACTORS.names())}"
                     ", or 'module.path:function'")


def with_extract(fn: RewardFn, extract: str | Extractor | None) -> RewardFn:
    """``fn`` scoring the extracted answer instead of the completion (``fn`` itself for
    ``none``). The wrapper keeps what :func:`~.base.score` looks at: sync or async, inline."""
    if extract is None or extract == "none":
        return fn
    ex = EXTRACTORS.resolve(extract) if isinstance(extract, str) else extract
    if inspect.iscoroutinefunction(fn):
        async def scored(completion: str, reference: Any, **kwargs: Any) -> Any:
            return await fn(ex(completion), reference, **kwargs)
    else:
        def scored(completion: str, reference: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            return fn(ex(completion), reference, **kwargs)
    functools.update_wrapper(scored, fn)  # __name__, and __dict__ (af_inline) for score()
    if getattr(fn, "af_inline", False) and ex not in BUILTIN:
        # a user's extractor is not known to be cheap: off the event loop, under the timeout
        scored.af_inline = False  # type: ignore[attr-defined]
    scored.af_extract = getattr(ex, "__name__", str(extract))  # type: ignore[attr-defined]
    return scored


#: the registered extractors, cheap and bounded (a reward marked inline stays inline with them)
BUILTIN = frozenset(EXTRACTORS.resolve(n) for n in EXTRACTORS.names())
