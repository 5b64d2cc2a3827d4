"""``multi_turn_tools``: the model calls tools through a text protocol until it answers.

A tool call is ``<tool>NAME(ARGS)</tool>`` in an assistant turn, e.g. ``<tool>mul(17,23)</tool>``;
generation stops at ``</tool>`` and the output, or ``error: ...``, comes back as a ``tool``
message. A turn without a call is the final answer, scored by the reward; after ``max_turns``
assistant turns the episode ends. Only generated tokens are masked 1. ``tool_latency`` adds a
seeded delay after each call. The protocol in full: docs/rollout.md, "The tool protocol".
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from astraflow.consumers.rollout.context import Draft, EpisodeContext, WorkflowError
from astraflow.consumers.rollout.latency import Latency, parse_latency, wait
from astraflow.consumers.rollout.workflows.base import WORKFLOWS
from astraflow.core.records import ChatMessage, Task

OPEN, CLOSE = "<tool>", "</tool>"
_CALL = re.compile(r"<tool>\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\((.*)\)\s*</tool>", re.DOTALL)


class ToolCallError(ValueError):
    """A ``<tool>`` block that does not follow the protocol."""


def parse_tool_call(text: str) -> tuple[str, dict[str, Any] | list[Any]] | None:
    """The (name, arguments) of the last tool call in ``text``; None when there is none.
    Arguments: a dict (a JSON object) or a list (positional: comma-separated JSON values).
    Raises ToolCallError for a ``<tool>`` block that is neither."""
    start = text.rfind(OPEN)
    if start < 0:
        return None
    block = text[start:]
    if CLOSE not in block:
        raise ToolCallError(f"unterminated tool call (no {CLOSE})")
    m = _CALL.match(block[:block.index(CLOSE) + len(CLOSE)])
    if m is None:
        raise ToolCallError('malformed tool call; expected <tool>name({"arg": value})</tool>')
    name, raw = m.group(1), m.group(2).strip()
    if not raw:
        return name, {}
    positional = not raw.startswith("{")
    try:
        args = json.loads(f"[{raw}]" if positional else raw)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"tool arguments are not valid JSON ({e.msg})") from None
    if not positional and not isinstance(args, dict):
        raise ToolCallError(f"tool arguments must be a JSON object, got {type(args).__name__}")
    return name, args


def parse_tool_latency(spec: Any, where: str) -> dict[str, Latency]:
    """``tool_latency`` as tool name -> distribution (``"*"``: every other tool)."""
    if spec is None:
        return {}
    if isinstance(spec, Mapping) and "type" not in spec:
        out = {}
        for tool, one in spec.items():
            lat = parse_latency(one, where=f"{where}.{tool}")
            if lat is not None:
                out[str(tool)] = lat
        return out
    lat = parse_latency(spec, where=where)
    return {} if lat is None else {"*": lat}


@WORKFLOWS.register("multi_turn_tools")
async def multi_turn_tools(ctx: EpisodeContext, task: Task, *, max_turns: int = 4,
                           tools: Sequence[str] | None = None, tool_timeout: float | None = None,
                           result_format: str = "<result>{output}</result>",
                           system_prompt: str | None = None,
                           tool_latency: Any = None, **sampling: Any) -> Draft:
    """See the module docstring. ``tools`` restricts the callable tools (None: every
    registered one); ``tool_latency``: extra seconds per call; other keyword arguments are
    sampling overrides."""
    if max_turns < 1:
        raise WorkflowError(f"multi_turn_tools: max_turns must be >= 1, got {max_turns}")
    latency = parse_tool_latency(tool_latency,
                                 "rollout.workflow.kwargs.multi_turn_tools.tool_latency")
    messages = list(task.prompt)
    if system_prompt:
        messages.insert(0, ChatMessage(role="system", content=system_prompt))
    conv = ctx.conversation(messages)
    stop = [*ctx.sampling(sampling)["stop"], CLOSE]
    finish_reason = None
    for turn in range(max_turns):
        gen = await conv.generate(**{**sampling, "stop": stop})
        try:
            call = parse_tool_call(gen.text)
        except ToolCallError as e:
            ctx.count("tool_failures")
            conv.add(ChatMessage(role="tool", content=result_format.format(output=f"error: {e}")))
            continue
        if call is None:
            break  # the final answer
        if turn == max_turns - 1:
            finish_reason = "length"  # still calling tools when the turns ran out
            break
        name, args = call
        if tools is not None and name not in tools:
            ctx.count("tool_failures")
            output = f"error: tool {name!r} is not available; available: {', '.join(tools)}"
        else:
            output = (await ctx.call_tool(name, args, timeout=tool_timeout)).output
            lat = latency.get(name, latency.get("*"))
            if lat is not None:
                waited = await wait(lat, random.Random(f"{task.id}/{ctx.sample_index}/{turn}"))
                ctx.timings["tool_latency"] = ctx.timings.get("tool_latency", 0.0) + waited
                ctx.count("tool_latency_waits")
                ctx.count("tool_latency_s", waited)
        conv.add(ChatMessage(role="tool", name=name, content=result_format.format(output=output)))
    answer = conv.last_text
    return conv.finish(await ctx.reward(answer), finish_reason=finish_reason)
