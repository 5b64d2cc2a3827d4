"""Agents for the ``openai_agent`` workflow tests, written only against the OpenAI SDK and named
by module path (``agent_helpers:two_turns``) as a config names them."""

from __future__ import annotations

import time
from typing import Any

#: (task id, sample index) -> the token ids each call sampled (``return_token_ids``)
SAMPLED: dict[tuple[str, int], list[list[int]]] = {}


def _call(client: Any, messages: list[Any], task: dict[str, Any], **kwargs: Any) -> str:
    r = client.chat.completions.create(
        model="default", messages=messages,
        extra_body={"return_token_ids": True, "skip_special_tokens": False}, **kwargs)
    SAMPLED.setdefault((task["id"], task["sample_index"]), []).append(
        r.choices[0].model_extra["token_ids"])
    return r.choices[0].message.content or ""


def two_turns(client: Any, task: dict[str, Any], *, answer: Any = None,
              check: str = "Check it.", **kwargs: Any) -> Any:
    """Asks, then checks; returns ``answer`` if given (a reward or a final answer), else the
    model's last text."""
    messages = list(task["prompt"])
    text = _call(client, messages, task, **kwargs)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": check}]
    text = _call(client, messages, task, **kwargs)
    return text if answer is None else answer


async def async_two_turns(client: Any, task: dict[str, Any]) -> float:
    messages = list(task["prompt"])
    for _ in range(2):
        r = await client.chat.completions.create(model="default", messages=messages)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "Again."}]
    return 0.75


def fails(client: Any, task: dict[str, Any]) -> float:
    _call(client, list(task["prompt"]), task)
    raise ValueError("the agent's own bug")


def silent(client: Any, task: dict[str, Any]) -> float:
    return 1.0  # never calls the model


def returns_none(client: Any, task: dict[str, Any]) -> None:
    _call(client, list(task["prompt"]), task)


def slow(client: Any, task: dict[str, Any]) -> str:
    _call(client, list(task["prompt"]), task)
    time.sleep(1.0)
    return _call(client, list(task["prompt"]), task)  # after the episode timed out: refused
