"""Record factories and bus helpers shared by the policy tests."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from astraflow.core.bus import Bus
from astraflow.core.records import (
    Batch,
    GroupStats,
    Record,
    Task,
    TensorEntry,
    Trajectory,
    TrajectoryGroup,
    WeightManifest,
    decode,
    encode,
    pack_f32,
    pack_i32,
    pack_u8,
    schema_header,
)
from astraflow.core.topics import topic_def, topic_name


def traj(group: str, i: int, reward: float, *, version: int = 0, policy: str = "default",
         task: str | None = None, finish: str = "stop", tokens: int = 12, prompt: int = 4
         ) -> Trajectory:
    """A trajectory of ``tokens`` tokens, the first ``prompt`` of them not generated."""
    gen = tokens - prompt
    return Trajectory(
        id=f"{policy}/{group}/{i}", task_id=task or group.split("#")[0], group_id=group,
        policy=policy, sample_index=i, token_ids=pack_i32(range(tokens)),
        loss_mask=pack_u8([0] * prompt + [1] * gen), logprobs=pack_f32([-0.5] * tokens),
        versions=pack_i32([-1] * prompt + [version] * gen), prompt_len=prompt, reward=reward,
        finish_reason=finish)  # type: ignore[arg-type]


def group_trajs(group: str, rewards: Iterable[float], **kw: Any) -> list[Trajectory]:
    return [traj(group, i, r, **kw) for i, r in enumerate(rewards)]


def tgroup(group: str, rewards: Iterable[float], *, version: int = 0, policy: str = "default"
           ) -> TrajectoryGroup:
    ts = group_trajs(group, rewards, version=version, policy=policy)
    rs = [t.reward for t in ts]
    mean = sum(rs) / len(rs)
    std = (sum((r - mean) ** 2 for r in rs) / len(rs)) ** 0.5
    return TrajectoryGroup(group_id=group, task_id=group.split("#")[0], policy=policy,
                           trajectories=ts, reward_mean=mean, reward_std=std, version=version)


def task(tid: str, *, n: int = 2, attempt: int = 0, group_id: str = "",
         created_at: float = 0.0) -> Task:
    return Task(id=tid, dataset="t", prompt=[], n_samples=n, attempt=attempt,
                group_id=group_id, created_at=created_at)


def stats(tid: str, kind: str, *, group: str | None = None, n: int = 4,
          policy: str = "default", kept: bool = True) -> GroupStats:
    mean = {"easy": 1.0, "hard": 0.0}.get(kind, 0.5)
    return GroupStats(task_id=tid, group_id=group or f"{tid}#0", policy=policy, n=n,
                      reward_mean=mean, reward_std=0.0 if kind != "none" else 0.5,
                      zero_variance=kind, version=0, kept=kept)  # type: ignore[arg-type]


def manifest(version: int, policy: str = "default") -> WeightManifest:
    """A well-formed full manifest of ``version`` (a stage refuses a malformed one)."""
    uri = f"{policy}/v{version:010d}.full.afw"
    return WeightManifest(policy=policy, version=version, kind="full", codec="afw/1",
                          tensors=[TensorEntry(name="w", shape=[2], dtype="float32", uri=uri,
                                               offset=0, length=8)],
                          total_bytes=8, full_bytes=8)


def trained_to(bus: Bus, run: str, version: int, policy: str = "default") -> None:
    """Write batch records until ``batches.<policy>`` holds ``version`` of them: what a
    trainer must have read to make ``version``, so a stage believes a manifest of it."""
    topic = topic_name(run, "batches", policy)
    have = sum(bus.describe_topic(topic).end_offsets.values())
    produce(bus, run, "batches", [Batch(id=f"{policy}-filler-{i}", policy=policy, seq=i,
                                        groups=[]) for i in range(have, version)],
            policy=policy)


def produce(bus: Bus, run: str, name: str, records: Iterable[Record],
            policy: str | None = None) -> None:
    p = bus.producer()
    topic = topic_name(run, name, policy)
    key_field = topic_def(name).key
    for r in records:
        p.produce(topic, encode(r), key=str(getattr(r, key_field)).encode(),
                  headers=[schema_header(r)])
    p.flush()
    p.close()


def read_all(bus: Bus, topic: str) -> list[Any]:
    """Every record of ``topic`` (a fresh group reads from the start), decoded."""
    import uuid

    info = bus.describe_topic(topic)
    want = sum(info.end_offsets.values())
    c = bus.consumer(f"read-{uuid.uuid4().hex[:8]}", [topic], session_timeout=5)
    out: list[Any] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < want:
            assert time.monotonic() < deadline, f"read {len(out)}/{want} of {topic}"
            out.extend(decode(m.value) for m in c.consume(500, 0.5))
    finally:
        c.close()
    return out


def end_count(bus: Bus, topic: str) -> int:
    return sum(bus.describe_topic(topic).end_offsets.values())
