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


def turns_demonstration(tokenizer: Any, spec: TaskSpec, turns: Sequence[tuple[str, bool]], *,
                        kind: str = "sft-turns") -> Trajectory:
    """An SFT trajectory of a multi-turn episode, laid out token for token as a workflow's
    conversation lays it out under a concatenating chat template: the rendered prompt, then
    each turn's text (``(text, trained)``: trained turns are the model's, masked 1; the others,
    tool results or user turns, masked 0); ``<eos>`` follows the last turn (the model's final
    answer ends with it) and any turn that ends with ``eos`` in the workflow is given it in its
    text's place by the caller. ``kind`` prefixes the ids."""
    from astraflow.models.prompt import encode as encode_text
    from astraflow.models.prompt import render_prompt

    if not turns or not turns[-1][1]:
        raise ValueError("a demonstration ends with a turn of the model's (trained)")
    _, prompt = render_prompt(tokenizer, spec.prompt)
    ids, mask = list(prompt), [0] * len(prompt)
    for i, (text, trained) in enumerate(turns):
        part = encode_text(tokenizer, text, special=False)
        if i == len(turns) - 1:
            part.append(tokenizer.eos_token_id)
        ids += part
        mask += [int(trained)] * len(part)
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
    eos = tokenizer.eos_token or ""
    return turns_demonstration(tokenizer, spec, [
        (first + eos + feedback, False), (str(spec.reference[answer_key]), True)],
        kind="sft-retry")


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
