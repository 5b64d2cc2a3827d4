"""Tools through the SDK: the tools offered are rendered into the prompt, the model's
``<tool>name({json})</tool>`` comes back as OpenAI ``tool_calls`` (also streamed), and the
next turn (the assistant's call and the tool's result echoed back) extends the recorded tokens
exactly: no drift, one trajectory."""

from __future__ import annotations

import json
from typing import Any

from gateway_helpers import arrays

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}}}}}
CALL = '<tool>add({"a": 2, "b": 3})</tool>'


def answer(prompt: str) -> str:
    """Call the tool until its result is in the conversation, then answer with it."""
    if "<result>5</result>" in prompt:
        return "It is 5."
    return "Let me add. " + CALL


def test_tool_calls_round_trip(serve: Any, rule_engine: Any, ascii_tokenizer: Any) -> None:
    engine = rule_engine(ascii_tokenizer, answer)
    served = serve(engine)
    client = served.client("tools-1")
    messages: list[Any] = [{"role": "user", "content": "2+3?"}]
    r = client.chat.completions.create(model="default", messages=messages, tools=[ADD])
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me add. "
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    # the tools were offered in the prompt, and generation stopped at the end of the call
    first = ascii_tokenizer.decode(engine.calls[0].prompt_ids, skip_special_tokens=True)
    assert 'add: Add two numbers. parameters={"properties"' in first
    assert "</tool>" in engine.calls[0].stop

    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    r2 = client.chat.completions.create(model="default", messages=messages, tools=[ADD])
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "It is 5." and not r2.choices[0].message.tool_calls
    second = ascii_tokenizer.decode(engine.calls[1].prompt_ids, skip_special_tokens=True)
    assert second.startswith(first) and second.endswith("Let me add. " + CALL + "<result>5</result>")

    stream = client.chat.completions.create(model="default", messages=messages[:1],
                                            tools=[ADD], stream=True)
    deltas = [c.choices[0] for c in stream]
    calls = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert [tc.function.name for tc in calls] == ["add"] and deltas[-1].finish_reason == "tool_calls"

    assert served.post("/sessions/tools-1/end", {"reward": 1.0}).status_code == 200
    info = served.get("/sessions/tools-1").json()
    # the streamed call re-asked the first turn: a branch, not drift; the newest chain is
    # trained, so the session gives one trajectory
    assert info["drift"] == 0 and info["trajectories"] == 1
    (t,) = served.trajectories()
    ids, mask, logprobs, _ = arrays(t)
    text = ascii_tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert text == "Let me add. " + CALL
    assert [s.role for s in t.spans] == ["prompt", "assistant"]


def test_tool_choice_none_and_unparsable_calls_stay_text(serve: Any, rule_engine: Any,
                                                         ascii_tokenizer: Any) -> None:
    engine = rule_engine(ascii_tokenizer, lambda p: "x <tool>nope(1)</tool>")
    client = serve(engine).client()
    for kwargs in ({"tools": [ADD]}, {"tools": [ADD], "tool_choice": "none"}):
        r = client.chat.completions.create(model="default", messages=[{"role": "user",
                                                                        "content": "?"}],
                                           **kwargs)
        assert r.choices[0].message.tool_calls is None
        assert r.choices[0].message.content == "x <tool>nope(1)</tool>"
    assert "</tool>" not in engine.calls[-1].stop  # tool_choice none: no stop at a call
