"""Where every trajectory of a run ended: trained on, waiting, or filtered with a reason.

Read from the topics themselves after the roles stopped (so it checks the processes rather
than trusting their counters). ``unaccounted`` must be 0 and ``trained_twice`` must be 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from astraflow.core.bus.reader import read_all
from astraflow.core.bus.types import Bus
from astraflow.core.errors import SchemaError
from astraflow.core.records import Batch, GroupStats, Record, Trajectory, TrajectoryGroup, decode
from astraflow.core.topics import group_name, topic_name


def read_topic(bus: Bus, topic: str, kind: type[Record]) -> Iterator[tuple[int, int, Any]]:
    """(partition, offset, record) of every record on ``topic`` now (undecodable ones skipped),
    read without a consumer group."""
    for m in read_all(bus, topic, client_id="accounting"):
        try:
            yield m.partition, m.offset, decode(m.value, kind)
        except SchemaError:
            continue


def account(bus: Bus, config: Any) -> dict[str, Any]:
    run, failed_reasons = config.run, set(config.data.assembler.failed_reasons)
    produced: dict[str, Trajectory] = {}
    for _, _, t in read_topic(bus, topic_name(run, "trajectories"), Trajectory):
        produced.setdefault(t.id, t)
    stats: dict[str, GroupStats] = {}
    for _, _, s in read_topic(bus, topic_name(run, "stats"), GroupStats):
        stats[s.group_id] = s
    grouped: set[str] = set()
    trained: Counter[str] = Counter()
    batched: set[str] = set()
    for p in config.policies:
        for _, _, g in read_topic(bus, topic_name(run, "groups", p), TrajectoryGroup):
            grouped.update(g.ids())
        topic = topic_name(run, "batches", p)
        consumed = bus.committed(group_name(run, "trainer", policy=p), topic)
        for part, off, b in read_topic(bus, topic, Batch):
            ids = [i for g in b.groups if not g.replayed for i in g.ids()]
            batched.update(ids)
            if off < consumed.get(part, 0):
                trained.update(ids)
    zero_var = "dynamic_sampling" in config.data.post_rollout
    out: Counter[str] = Counter()
    for tid, t in produced.items():
        if tid in trained:
            out["trained"] += 1
        elif tid in batched:
            out["in batches after the trainer stopped"] += 1
        elif tid in grouped:
            out["in groups not yet batched"] += 1
        elif t.finish_reason in failed_reasons:
            out["failed episode"] += 1
        elif t.group_id not in stats:
            out["group still open when the run stopped"] += 1
        elif zero_var and stats[t.group_id].zero_variance != "none":
            out["filtered: zero variance (dynamic sampling)"] += 1
        elif "staleness" in config.data.post_rollout or stats[t.group_id].n < \
                config.data.assembler.min_group_size:
            out["filtered: stale or incomplete group"] += 1
        else:
            out["unaccounted"] += 1
    return {"produced": len(produced), **dict(out), "unaccounted": out.get("unaccounted", 0),
            "trained_twice": sum(1 for n in trained.values() if n > 1)}
