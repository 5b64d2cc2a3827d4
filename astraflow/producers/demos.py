"""Demonstrations for the SFT warm-up: tasks with their reference answers, as training
batches (``Batch`` records) on ``batches.<policy>``.

Each demonstration is one trajectory: the prompt rendered exactly as the rollout worker renders
it (:func:`astraflow.models.prompt.render_prompt`), then the answer and ``<eos>``;
the loss mask covers the answer and ``<eos>`` only. Batches are keyed and numbered like the
batcher's, so the SFT trainer consumes them like any other batch topic.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from astraflow.core.bus.types import Bus
from astraflow.core.records import (
    Batch,
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


def retry_demonstration(tokenizer: Any, spec: TaskSpec, *, first: str, feedback: str,
                        answer_key: str = "answer") -> Trajectory:
    """A solver's retry after a reject, laid out token for token as the ``solver_verifier``
    workflow lays out its conversation: the prompt, a rejected ``first`` answer and ``<eos>``,
    the ``feedback`` user turn (the verifier's text and the retry prompt), all masked 0; then
    the reference answer and ``<eos>``, masked 1 (only the retry is taught)."""
    from astraflow.models.prompt import encode as encode_text
    from astraflow.models.prompt import render_prompt

    eos = tokenizer.eos_token_id
    _, prompt = render_prompt(tokenizer, spec.prompt)
    context = (prompt + encode_text(tokenizer, first, special=False) + [eos]
               + encode_text(tokenizer, feedback, special=False))
    answer = encode_text(tokenizer, str(spec.reference[answer_key]), special=False) + [eos]
    ids = context + answer
    n, m = len(context), len(answer)
    return Trajectory(
        id=f"sft-retry/{spec.id}", task_id=spec.id, group_id=f"sft-retry/{spec.id}",
        sample_index=0, group_size=1, token_ids=pack_i32(ids),
        loss_mask=pack_u8([0] * n + [1] * m), logprobs=pack_f32([0.0] * len(ids)),
        versions=pack_i32([-1] * len(ids)), prompt_len=len(prompt), reward=1.0,
        worker_id="demos")


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
