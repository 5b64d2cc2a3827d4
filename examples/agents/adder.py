"""A multi-turn agent written only against the OpenAI SDK (examples/gateway_agent.yaml trains it).

It asks the task's question, checks the answer itself, and when the check fails says so and
asks again (at most ``tries`` times); its final answer is the model's last one, which
`astraflow run` scores with the run's reward against the task's reference. Nothing here knows
about AstraFlow: the same function runs against any OpenAI-compatible endpoint
(``episode(openai.OpenAI(), task)``).

The check stands in for what a real agent checks with (a unit test, a calculator, a
compiler): here it adds the two numbers of the question. The second user turn is ``retry``
with ``{question}`` replaced: by default the question again, all the tiny quickstart model can
read (digits and "+-*="); an instruction-following model would be told "That is not right.
{question}".
"""

from __future__ import annotations

import re
from typing import Any


def check(question: str, answer: str) -> bool:
    """Whether ``answer`` is the sum the question ``a+b=`` asks for."""
    m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*=?\s*", question)
    return m is not None and answer.strip() == str(int(m.group(1)) + int(m.group(2)))


def episode(client: Any, task: dict[str, Any], *, model: str = "default", tries: int = 2,
            retry: str = "{question}") -> str:
    """One episode of ``task`` (``task["prompt"]``: OpenAI chat messages); the final answer."""
    messages = list(task["prompt"])
    question = messages[-1]["content"]
    answer = ""
    for turn in range(tries):
        if turn:
            messages.append({"role": "user", "content": retry.format(question=question)})
        reply = client.chat.completions.create(model=model, messages=messages)
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        if check(question, answer):
            break
    return answer
