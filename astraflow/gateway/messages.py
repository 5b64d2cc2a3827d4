"""OpenAI chat messages and tools as the text the model reads and writes (the tool protocol of
the ``multi_turn_tools`` workflow, so a policy trained on either speaks both).

``tools`` become one system message (``gateway.tools_prompt``); a tool call is the text
``<tool>NAME(ARGUMENTS)</tool>``; a ``tool`` message is ``gateway.tool_result_format``;
``developer`` messages are ``system`` messages; content parts are joined (text parts only).
Model output is turned back into ``tool_calls`` only when it is exactly content followed by
well-formed calls of offered tools, so that rendering the returned message gives back the very
text the model wrote; anything else is plain content. See docs/gateway.md#tools.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence

from astraflow.consumers.rollout.workflows.multi_turn import CLOSE, OPEN
from astraflow.core.records import ChatMessage
from astraflow.gateway.errors import bad_request
from astraflow.gateway.schemas import Message, ToolDef

_BLOCK = re.compile(r"<tool>([A-Za-z_][A-Za-z0-9_.-]*)\((.*?)\)</tool>", re.DOTALL)


def tool_text(name: str, arguments: str) -> str:
    """The text of one tool call, as the model writes it."""
    return f"{OPEN}{name}({arguments}){CLOSE}"


def tools_message(tools: Sequence[ToolDef], template: str) -> ChatMessage | None:
    """The system message that offers ``tools`` (None: no tools, or an empty template)."""
    if not tools or not template:
        return None
    lines = []
    for t in tools:
        f = t.function
        params = json.dumps(f.parameters or {}, separators=(",", ":"), sort_keys=True)
        lines.append(f"{f.name}: {f.description or ''} parameters={params}".replace("  ", " "))
    return ChatMessage(role="system", content=template.replace("{tools}", "\n".join(lines)))


def _content(m: Message) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    return "".join(p.text for p in m.content)


def to_chat(messages: Sequence[Message], *, tools: Sequence[ToolDef] | None,
            tools_prompt: str, result_format: str) -> tuple[list[ChatMessage], int]:
    """The conversation to render, and how many messages were put before the request's own
    (the tools message: 0 or 1)."""
    out: list[ChatMessage] = []
    offered = tools_message(tools or (), tools_prompt)
    if offered is not None:
        out.append(offered)
    names: dict[str, str] = {}  # tool call id -> function name
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        text = _content(m)
        if m.role == "assistant":
            for call in m.tool_calls or ():
                names[call.id] = call.function.name
                text += tool_text(call.function.name, call.function.arguments)
            out.append(ChatMessage(role="assistant", content=text, name=m.name))
        elif m.role == "tool":
            name = names.get(m.tool_call_id or "", m.name)
            out.append(ChatMessage(role="tool", content=result_format.replace("{output}", text),
                                   name=name))
        else:
            if m.tool_calls:
                raise bad_request(f"{where}: only assistant messages carry tool_calls",
                                  param=f"{where}.tool_calls")
            role = "system" if m.role == "developer" else m.role
            out.append(ChatMessage(role=role, content=text, name=m.name))
    return out, (1 if offered is not None else 0)


def span_role(messages: Sequence[ChatMessage]) -> str:
    """The span role of tokens rendering ``messages``: their one role, else ``other``."""
    roles = {m.role for m in messages}
    return roles.pop() if len(roles) == 1 else "other"


def parse_calls(text: str, names: Sequence[str]) -> tuple[str, list[tuple[str, str]]] | None:
    """``text`` as (content, [(name, arguments)]) when it is content followed by nothing but
    well-formed calls of tools in ``names``; None otherwise (it is plain content)."""
    start = text.find(OPEN)
    if start < 0:
        return None
    calls = []
    pos = start
    while pos < len(text):
        m = _BLOCK.match(text, pos)
        if m is None or m.group(1) not in names:
            return None
        try:
            args = json.loads(m.group(2))
        except json.JSONDecodeError:
            return None
        if not isinstance(args, dict):
            return None
        calls.append((m.group(1), m.group(2)))
        pos = m.end()
    return text[:start], calls


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
