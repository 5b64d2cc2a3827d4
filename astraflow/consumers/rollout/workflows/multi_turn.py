"""``multi_turn_tools``: the model calls tools through a text protocol until it answers.

The protocol (what the model writes, what it gets back):

* a tool call is ``<tool>NAME(ARGS)</tool>`` anywhere in an assistant turn, ARGS a JSON object
  of keyword arguments or nothing: ``<tool>calculator({"expression": "17*23"})</tool>``.
  Generation stops at ``</tool>`` (added to the stop strings), so a turn holds at most one call;
* the tool's output comes back as a ``tool`` message (``name`` = the tool) whose content is
  ``result_format`` with ``{output}`` replaced, ``<result>OUTPUT</result>`` by default; errors
  (unknown tool, malformed call, bad arguments, exception, timeout) come back the same way as
  ``<result>error: ...</result>``, so the model can recover;
* a turn without ``<tool>`` is the final answer; the reward scores its text. After
  ``max_turns`` assistant turns the episode ends (``finish_reason="length"`` if the last turn
  was still a tool call).

Loss mask: the tokens the model generated in each assistant turn are 1; the prompt, every tool
message and the chat template's tokens around them are 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from astraflow.consumers.rollout.context import Draft, EpisodeContext
from astraflow.consumers.rollout.workflows.base import WORKFLOWS
from astraflow.core.records import ChatMessage, Task

OPEN, CLOSE = "<tool>", "</tool>"
_CALL = re.compile(r"<tool>\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\((.*)\)\s*</tool>", re.DOTALL)


class ToolCallError(ValueError):
    """A ``<tool>`` block that does not follow the protocol."""


def parse_tool_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """The (name, arguments) of the last tool call in ``text``; None when there is none.
    Raises ToolCallError for a ``<tool>`` block that is not ``NAME(JSON object)``."""
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
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ToolCallError(f"tool arguments are not valid JSON ({e.msg})") from None
    if not isinstance(args, dict):
        raise ToolCallError(f"tool arguments must be a JSON object, got {type(args).__name__}")
    return name, args


@WORKFLOWS.register("multi_turn_tools")
async def multi_turn_tools(ctx: EpisodeContext, task: Task, *, max_turns: int = 4,
                           tools: Sequence[str] | None = None, tool_timeout: float | None = None,
                           result_format: str = "<result>{output}</result>",
                           system_prompt: str | None = None, **sampling: Any) -> Draft:
    """See the module docstring. ``tools`` restricts the callable tools (None: every
    registered one); other keyword arguments are sampling overrides."""
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
        conv.add(ChatMessage(role="tool", name=name, content=result_format.format(output=output)))
    answer = conv.last_text
    return conv.finish(await ctx.reward(answer), finish_reason=finish_reason)
