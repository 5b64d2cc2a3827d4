"""Where every trajectory of a run ended: trained on, waiting, or filtered with a reason.

Read from the topics after the roles stopped, so it checks the processes rather than their
counters: ``unaccounted`` and ``trained_twice`` must be 0. A batch counts as trained by policy
``q``'s trainer when it lies on ``batches.<q>`` before that trainer's committed offset, names
``q`` and was not dead-lettered; a batch id counts once per trainer (docs/metrics.md).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from astraflow.core.bus.reader import read_all
from astraflow.core.bus.types import Bus
from astraflow.core.errors import SchemaError
from astraflow.core.records import (
    Batch,
    DeadLetter,
    GroupStats,
    Record,
    Trajectory,
    TrajectoryGroup,
    decode,
)
from astraflow.core.topics import group_name, topic_name

CHECKS = ("produced", "unaccounted", "trained_twice", "trained_by_wrong_trainer")
"""Keys of :func:`account` that are not a disposition: every other int key is one, and they
sum to ``produced`` (``by_policy`` is the per-policy breakdown)."""
#: the bucket of trajectories consumed by a trainer in a batch it dead-lettered
DEAD_LETTERED = "dead-lettered with its batch by the trainer (see dlq)"
#: the bucket of trajectories the post-rollout stage refused at its door (values that cannot
#: be trusted: token ids outside the vocabulary, non-finite rewards; an unknown policy)
REFUSED = "dead-lettered by the post-rollout stage (see dlq for the reason)"


def dead_letters(bus: Bus, run: str) -> set[tuple[str, int, int]]:
    """(topic, partition, offset) of every record of ``run`` on the dead-letter topic."""
    return {(d.topic, d.partition, d.offset)
            for _, _, d in read_topic(bus, topic_name(run, "dlq"), DeadLetter)}


def read_topic(bus: Bus, topic: str, kind: type[Record]) -> Iterator[tuple[int, int, Any]]:
    """(partition, offset, record) of every record on ``topic`` now (undecodable ones skipped),
    read without a consumer group."""
    for m in read_all(bus, topic, client_id="accounting"):
        try:
            yield m.partition, m.offset, decode(m.value, kind)
        except SchemaError:
            continue


def trained_by(bus: Bus, config: Any, dropped: set[tuple[str, int, int]] | None = None
               ) -> tuple[dict[str, list[str]], set[str], set[str]]:
    """Which trainers trained each trajectory (id → the policies of those trainers, one entry
    per batch id that trained it), the ids found in any batch (trained or not), and those of
    batches a trainer dead-lettered (``dropped``: the dead letters, read here when None)."""
    run = config.run
    trainers: dict[str, list[str]] = defaultdict(list)
    batched: set[str] = set()
    dead: set[str] = set()
    # batches a trainer dead-lettered (records gone or untrustworthy, a poison batch):
    # consumed, not trained
    if dropped is None:
        dropped = dead_letters(bus, run)
    for q in config.policies:
        topic = topic_name(run, "batches", q)
        consumed = bus.committed(group_name(run, "trainer", policy=q), topic)
        seen: set[str] = set()
        for part, off, b in read_topic(bus, topic, Batch):
            ids = [i for g in b.groups if not g.replayed for i in g.ids()]
            batched.update(ids)
            if (topic, part, off) in dropped:
                dead.update(ids)
                continue
            if off < consumed.get(part, 0) and b.policy == q and b.id not in seen:
                seen.add(b.id)
                for i in ids:
                    trainers[i].append(q)
    return trainers, batched, dead


def disposition(t: Trajectory, config: Any, *, trained: bool, batched: bool, grouped: bool,
                stats: GroupStats | None, dead: bool = False) -> str:
    """The bucket of one trajectory (its group's stats: those of its policy's group)."""
    if trained:
        return "trained"
    if dead:
        return DEAD_LETTERED
    if batched:
        return "in batches after the trainer stopped"
    if grouped:
        if "staleness" in config.data.batch:  # the batch stage's drops leave no record
            return "in groups not batched (waiting, or dropped stale by the batch stage)"
        return "in groups not yet batched"
    if t.finish_reason in set(config.data.assembler.failed_reasons):
        return "failed episode"
    if stats is None:
        return "group still open when the run stopped"
    if "dynamic_sampling" in config.data.post_rollout and stats.zero_variance != "none":
        return "filtered: zero variance (dynamic sampling)"
    if ("staleness" in config.data.post_rollout
            or stats.n < config.data.assembler.min_group_size):
        return "filtered: stale or incomplete group"
    return "unaccounted"


def _result(out: Counter[str], produced: int, twice: int) -> dict[str, Any]:
    return {"produced": produced, **dict(out), "unaccounted": out.get("unaccounted", 0),
            "trained_twice": twice}


def account(bus: Bus, config: Any) -> dict[str, Any]:
    run = config.run
    letters = dead_letters(bus, run)
    trajectories = topic_name(run, "trajectories")
    produced: dict[str, Trajectory] = {}
    refused: set[str] = set()  # dead-lettered at the post-rollout stage's door
    for part, off, t in read_topic(bus, trajectories, Trajectory):
        if (trajectories, part, off) in letters:
            refused.add(t.id)
        produced.setdefault(t.id, t)
    # several policies' groups share a group id (one episode, one trajectory per policy),
    # and so do several roles' of one policy (a group per role)
    stats: dict[tuple[str, str, str], GroupStats] = {}
    for _, _, s in read_topic(bus, topic_name(run, "stats"), GroupStats):
        stats[(s.policy, s.agent, s.group_id)] = s
    grouped: set[str] = set()
    for p in config.policies:
        for _, _, g in read_topic(bus, topic_name(run, "groups", p), TrajectoryGroup):
            grouped.update(g.ids())
    trainers, batched, dead = trained_by(bus, config, letters)
    out: Counter[str] = Counter()
    per: dict[str, Counter[str]] = {p: Counter() for p in config.policies}
    made: Counter[str] = Counter()  # per policy: produced, trained twice, by a wrong trainer
    twice: Counter[str] = Counter()
    wrong: Counter[str] = Counter()
    for tid, t in produced.items():
        by = trainers.get(tid, [])
        bucket = REFUSED if tid in refused and not by else disposition(
            t, config, trained=bool(by), batched=tid in batched, grouped=tid in grouped,
            stats=stats.get((t.policy, t.agent, t.group_id)), dead=tid in dead)
        out[bucket] += 1
        per.setdefault(t.policy, Counter())[bucket] += 1
        made[t.policy] += 1
        twice[t.policy] += len(by) > 1
        wrong[t.policy] += any(q != t.policy for q in by)
    result = _result(out, len(produced), sum(twice.values()))
    if len(config.policies) > 1:  # one policy: the overall keys say it all
        result["trained_by_wrong_trainer"] = sum(wrong.values())
        result["by_policy"] = {p: {**_result(c, made[p], twice[p]),
                                   "trained_by_wrong_trainer": wrong[p]}
                               for p, c in per.items()}
    return result
