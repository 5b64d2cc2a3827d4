"""Demonstrations for the SFT warm-up: tasks with their reference answers, as training
batches (``Batch`` records) on ``batches.<policy>``.

Each demonstration is one trajectory: the prompt rendered exactly as the rollout worker renders
it (:func:`astraflow.models.prompt.render_prompt`), then the answer and ``<eos>``;
the loss mask covers the answer and ``<eos>`` only. Batches are keyed and numbered like the
batcher's, so the SFT trainer consumes them like any other batch topic.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from astraflow.core.bus.types import Bus
from astraflow.core.records import (
    Batch,
    ChatMessage,
    Group,
    Trajectory,
    pack_f32,
    pack_i32,
    pack_u8,
)
from astraflow.core.stream import Output, send
from astraflow.core.topics import route
from astraflow.producers.sources import TaskSpec


def demonstration(tokenizer: Any, spec: TaskSpec, answer_key: str = "answer") -> Trajectory:
    """One SFT trajectory: prompt tokens (mask 0) then answer + eos tokens (mask 1)."""
    from astraflow.models.prompt import encode as encode_text
    from astraflow.models.prompt import render_prompt

    _, prompt = render_prompt(tokenizer, spec.prompt)
    answer = encode_text(tokenizer, str(spec.reference[answer_key]), special=False)
    answer.append(tokenizer.eos_token_id)
    ids = prompt + answer
    n, m = len(prompt), len(answer)
    return Trajectory(
        id=f"sft/{spec.id}", task_id=spec.id, group_id=f"sft/{spec.id}", sample_index=0,
        group_size=1, token_ids=pack_i32(ids), loss_mask=pack_u8([0] * n + [1] * m),
        logprobs=pack_f32([0.0] * len(ids)), versions=pack_i32([-1] * len(ids)),
        prompt_len=n, reward=1.0, worker_id="demos")


@dataclass(frozen=True)
class Turn:
    """One turn of a demonstrated episode after its prompt: a message; whether the loss
    covers it (``trained``: only the model's own turns can be); for an assistant turn, whether
    the model ended it with ``<eos>`` (``eos``; False: a stop string ended it, as ``</tool>``
    ends a tool call)."""

    message: ChatMessage
    trained: bool = False
    eos: bool = True


def turns_demonstration(tokenizer: Any, spec: TaskSpec, turns: Sequence[Turn], *,
                        kind: str = "sft-turns") -> Trajectory:
    """An SFT trajectory of a multi-turn episode, laid out token for token as a workflow's
    conversation (:class:`astraflow.consumers.rollout.context.Conversation`) lays it out under
    the tokenizer's chat template: the rendered prompt; each assistant turn as the model's
    tokens (its text, then ``<eos>`` where the model ends it so); each other message (a tool's
    result, a user turn) as the text the template adds for it up to the next generation
    prompt (its role markers, the end of the turn before). Only ``trained`` turns are masked
    1. ``kind`` prefixes the ids."""
    from astraflow.models.prompt import appended, decode, encode, render_prompt

    if not turns or not turns[-1].trained or turns[-1].message.role != "assistant":
        raise ValueError("a demonstration ends with a trained turn of the model's")
    text, prompt = render_prompt(tokenizer, spec.prompt)
    messages = list(spec.prompt)
    ids, mask = list(prompt), [0] * len(prompt)
    for turn in turns:
        m = turn.message
        if m.role == "assistant":
            part = encode(tokenizer, m.content, special=False)
            if turn.eos:
                part.append(tokenizer.eos_token_id)
            text += decode(tokenizer, part, skip_special=False)
        else:
            delta, part = appended(tokenizer, messages, [m], text=text)
            text += delta
        messages.append(m)
        ids += part
        mask += [int(turn.trained and m.role == "assistant")] * len(part)
    return Trajectory(
        id=f"{kind}/{spec.id}", task_id=spec.id, group_id=f"{kind}/{spec.id}", sample_index=0,
        group_size=1, token_ids=pack_i32(ids), loss_mask=pack_u8(mask),
        logprobs=pack_f32([0.0] * len(ids)), versions=pack_i32([-1] * len(ids)),
        prompt_len=len(prompt), reward=1.0, worker_id="demos")


def retry_demonstration(tokenizer: Any, spec: TaskSpec, *, first: str, feedback: str,
                        answer_key: str = "answer") -> Trajectory:
    """A solver's retry after a reject, laid out token for token as the ``solver_verifier``
    workflow lays out its conversation: the prompt, a rejected ``first`` answer and ``<eos>``,
    the ``feedback`` user turn (the verifier's text and the retry prompt), all masked 0; then
    the reference answer and ``<eos>``, masked 1 (only the retry is taught)."""
    return turns_demonstration(tokenizer, spec, [
        Turn(ChatMessage(role="assistant", content=first)),
        Turn(ChatMessage(role="user", content=feedback)),
        Turn(ChatMessage(role="assistant", content=str(spec.reference[answer_key])),
             trained=True)], kind="sft-retry")


def demo_batches(tokenizer: Any, specs: Iterator[TaskSpec], *, policy: str, batch_size: int,
                 steps: int, extra: Iterable[Trajectory] = ()) -> Iterator[Batch]:
    """``steps`` batches of ``batch_size`` demonstrations, cycling through ``specs`` (and the
    ready-made ``extra`` ones, interleaved evenly)."""
    pool = [demonstration(tokenizer, s) for s in specs]
    more = list(extra)
    if more and pool:
        every = max(1, len(pool) // len(more))
        mixed: list[Trajectory] = []
        for i, t in enumerate(pool):
            mixed.append(t)
            if i % every == every - 1 and more:
                mixed.append(more.pop(0))
        pool = mixed + more
    elif more:
        pool = more
    if not pool:
        return
    stream = itertools.cycle(pool)
    for seq in range(steps):
        groups = [Group(group_id=t.group_id, task_id=t.task_id, trajectories=[t])
                  for t in itertools.islice(stream, batch_size)]
        yield Batch(id=f"{policy}-sft-{seq}", policy=policy, seq=seq, groups=groups)


def produce_demos(bus: Bus, run: str, policy: str, batches: Iterator[Batch]) -> int:
    """Produce the batches to ``batches.<policy>``; returns how many."""
    producer = bus.producer(client_id=f"demos-{policy}")
    n = 0
    for b in batches:
        if b.policy != policy:
            raise ValueError(f"a batch of policy {b.policy!r} among the demonstrations of "
                             f"{policy!r}: build them with demo_batches(policy={policy!r})")
        topic, key = route(run, b)
        send(producer, Output(topic, b, key))
        n += 1
    producer.flush()
    producer.close()
    return n
