"""Helpers of the rollout tests: a scripted engine, task/trajectory I/O, test workflows.

Also imported by worker subprocesses (``rollout_helpers:slow_single_turn`` as a workflow path),
so it imports nothing heavy at module level.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from astraflow.consumers.rollout.engines.base import GenRequest, GenResult
from astraflow.core.bus import Bus
from astraflow.core.records import ChatMessage, Task, Trajectory, decode
from astraflow.core.stream import Output, send
from astraflow.core.topics import topic_name


class ScriptedEngine:
    """An engine that answers each call with the next scripted text (tokenized), logprob -0.5
    per token, version ``version``. Tests the workflow logic, not an engine."""

    name = "scripted"
    continuous = False
    max_batch_size = 8

    def __init__(self, tokenizer: Any, script: Sequence[str], *, version: int = 0,
                 eos: bool = True) -> None:
        self.tokenizer = tokenizer
        self.script = list(script)
        self.calls: list[GenRequest] = []
        self._version = version
        self.eos = eos

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        out = []
        for r in requests:
            self.calls.append(r)
            text = self.script.pop(0) if self.script else ""
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            stop = next((s for s in r.stop if s in text), None)
            if stop is None and self.eos:
                ids = [*ids, self.tokenizer.eos_token_id]
            cut = len(ids) > r.max_new_tokens  # its end (EOS or the stop string) cut off
            ids = ids[:r.max_new_tokens]
            finish = "stop" if (stop is not None or self.eos) and not cut else "length"
            out.append(GenResult(ids, [-0.5] * len(ids), [self._version] * len(ids), finish))
        return out

    def weight_target(self) -> None:
        return None

    def update_weights(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def close(self) -> None:
        pass


def make_task(i: int, *, n: int = 2, workflow: str = "single_turn", a: int | None = None,
              dataset: str = "t") -> Task:
    a = i if a is None else a
    return Task(id=f"task-{i}", dataset=dataset,
                prompt=[ChatMessage(role="user", content=f"{a}+1=")],
                reference={"answer": str(a + 1)}, n_samples=n, workflow=workflow)


def produce(bus: Bus, run: str, tasks: Iterable[Task], topic: str = "tasks") -> int:
    p = bus.producer()
    n = 0
    for t in tasks:
        send(p, Output(topic_name(run, topic), t, t.id.encode()))
        n += 1
    p.flush()
    p.close()
    return n


def read_all(bus: Bus, topic: str, kind: type = Trajectory, *, timeout: float = 2.0) -> list[Any]:
    """Every record of ``topic`` now (a fresh group from the beginning)."""
    import uuid

    ends = bus.describe_topic(topic).end_offsets
    c = bus.consumer(f"read-{uuid.uuid4().hex[:8]}", [topic], start="earliest")
    pos = dict.fromkeys(ends, 0)
    out = []
    deadline = time.monotonic() + timeout + 30
    try:
        while any(pos[p] < e for p, e in ends.items()) and time.monotonic() < deadline:
            for m in c.consume(500, 0.2):
                pos[m.partition] = m.offset + 1
                out.append(decode(m.value, kind))
    finally:
        c.close()
    return out


class Follow:
    """Accumulates the records of a topic (a consumer group of its own, from the start)."""

    def __init__(self, bus: Bus, topic: str, kind: type) -> None:
        import uuid

        self.consumer = bus.consumer(f"follow-{uuid.uuid4().hex[:8]}", [topic],
                                     start="earliest")
        self.kind = kind
        self.records: list[Any] = []

    def poll(self) -> list[Any]:
        for m in self.consumer.consume(500, 0.2):
            self.records.append(decode(m.value, self.kind))
        return self.records

    def close(self) -> None:
        self.consumer.close()


async def slow_single_turn(ctx: Any, task: Task, delay: float = 0.4, **sampling: Any) -> Any:
    """single_turn with a pause first (so that tests can act mid-episode)."""
    await asyncio.sleep(delay)
    gen = await ctx.generate(messages=task.prompt, **sampling)
    return gen.conversation.finish(await ctx.reward(gen.text))


async def held_single_turn(ctx: Any, task: Task, hold: float = 0.0, **sampling: Any) -> Any:
    """single_turn that waits ``hold`` seconds between generating and scoring: a worker whose
    config holds long keeps its episodes mid-flight (tokens generated) until it is stopped."""
    gen = await ctx.generate(messages=task.prompt, **sampling)
    await asyncio.sleep(hold)
    return gen.conversation.finish(await ctx.reward(gen.text))


async def failing_workflow(ctx: Any, task: Task) -> Any:
    await ctx.generate(messages=task.prompt)
    raise RuntimeError("boom in the workflow")


def one_reward(completion: str, reference: Any) -> float:
    """1 for any completion, an empty one too (what is scored 0 was scored by a rule)."""
    return 1.0


def length_reward(completion: str, reference: Any, *, scale: float = 1.0) -> float:
    """A user reward loaded by module path in the tests."""
    return scale * len(completion)


def processed_logprobs(model: Any, prompt: list[int], tokens: list[int], *,
                       temperature: float, top_p: float) -> list[float]:
    """Teacher-forced logprobs of ``tokens`` after ``prompt`` under ``temperature`` and
    ``top_p`` (renormalised): what a vLLM engine in ``processed_logprobs`` mode reports."""
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    out = []
    for j, t in enumerate(tokens):
        lp = torch.log_softmax(logits[len(prompt) - 1 + j] / temperature, -1)
        probs, order = lp.exp().sort(descending=True)
        keep = order[(probs.cumsum(-1) - probs) < top_p]
        masked = torch.full_like(lp, float("-inf"))
        masked[keep] = lp[keep]
        out.append(torch.log_softmax(masked, -1)[t].item())
    return out
