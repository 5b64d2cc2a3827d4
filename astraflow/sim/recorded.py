"""A workload from a run directory made by ``astraflow run``: its trajectories' turns and timings.

An episode is every trajectory record with one (group id, sample index); its turns are the
assistant spans of those records and its waits come from their ``timings``. Only total wait
times are recorded, so the replay keeps the totals, not where they fell. The trainer's
median step seconds and groups per step come from ``trainer-<policy>.jsonl``
(docs/replay.md)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from astraflow.core.bus import connect, embedded_url
from astraflow.core.bus.reader import read_all
from astraflow.core.errors import ConfigError, SchemaError
from astraflow.core.jsonl import log_rows
from astraflow.core.records import Trajectory, decode, unpack
from astraflow.core.topics import parse_topic
from astraflow.sim.errors import ReplayError
from astraflow.sim.workload import Episode, Group, Segment, Workload

SKIP_TIMINGS = {"generate", "total", "tools"}


def turns(t: Trajectory) -> list[int]:
    """Generated tokens per model turn of ``t``."""
    mask = unpack(t.loss_mask, "u1")
    spans = [s for s in t.spans if s.role == "assistant"]
    if not spans:
        n = int(mask.sum())
        return [n] if n else []
    return [int(mask[s.start:s.end].sum()) or (s.end - s.start) for s in spans]


def episode(records: list[Trajectory]) -> Episode:
    """One episode from its records (see the module docstring)."""
    toks = [n for r in records for n in turns(r)]
    timings = records[0].timings
    tools = max(0.0, timings.get("tools", 0.0))
    tail = sum(max(0.0, v) for k, v in timings.items() if k not in SKIP_TIMINGS)
    if not toks:
        return Episode((Segment(0, tools + tail),), samples=len(records))
    gaps = len(toks) - 1
    waits = [tools / gaps] * gaps + [tail] if gaps else [tools + tail]
    return Episode(tuple(Segment(n, w) for n, w in zip(toks, waits, strict=True)),
                   samples=len(records))


def trajectories_topic(topics: list[str], run: str | None, where: Path) -> str:
    found = {}
    for name in topics:
        try:
            ref = parse_topic(name)
        except ConfigError:
            continue
        if ref.name == "trajectories":
            found[ref.run] = name
    if run is not None:
        if run not in found:
            raise ReplayError(f"{where} has no trajectories of run {run!r}; runs there: "
                              f"{', '.join(sorted(found)) or 'none'}")
        return found[run]
    if not found:
        raise ReplayError(f"{where} has no trajectories topic: was the run started? (topics: "
                          f"{', '.join(sorted(topics)) or 'none'})")
    if len(found) > 1:
        raise ReplayError(f"{where} holds several runs ({', '.join(sorted(found))}); "
                          "choose one with --run")
    return next(iter(found.values()))


def trainer_log(run_dir: Path) -> tuple[float | None, int | None]:
    """The slowest trainer's median seconds per step and its median groups per step."""
    best: tuple[float, int | None] | None = None
    for path in sorted(run_dir.glob("trainer-*.jsonl")):
        steps, groups = [], []
        for row in log_rows(path):
            if isinstance(row.get("step_s"), int | float):
                steps.append(float(row["step_s"]))
                if isinstance(row.get("groups"), int | float):
                    groups.append(int(row["groups"]))
        if steps:
            med = statistics.median(steps)
            if best is None or med > best[0]:
                best = (med, int(statistics.median(groups)) if groups else None)
    return best if best is not None else (None, None)


def load_run(run_dir: Path | str, *, run: str | None = None,
             policy: str | None = None) -> Workload:
    """The workload recorded in ``run_dir`` (its ``bus.db``); ``policy``: only that policy's
    trajectories. Raises ReplayError naming the path when there is nothing to replay."""
    where = Path(run_dir).expanduser()
    if not where.is_dir():
        raise ReplayError(f"{where}: no such run directory")
    db = where / "bus.db"
    if not db.is_file():
        raise ReplayError(f"{where} has no bus.db: not a run directory made by `astraflow run` "
                          f"(expected {db})")
    bus = connect(embedded_url(db.resolve()))
    by_episode: dict[tuple[str, int], list[Trajectory]] = defaultdict(list)
    first: dict[str, float] = {}
    skipped = 0
    try:
        topic = trajectories_topic(list(bus.list_topics()), run, where)
        for m in read_all(bus, topic, client_id="replay"):
            try:
                t = decode(m.value, Trajectory)
            except SchemaError:
                t = None
            if not isinstance(t, Trajectory):
                skipped += 1
                continue
            if policy is not None and t.policy != policy:
                continue
            by_episode[(t.group_id, t.sample_index)].append(t)
            first[t.group_id] = min(first.get(t.group_id, t.created_at), t.created_at)
    finally:
        bus.close()
    if not by_episode:
        what = f" of policy {policy!r}" if policy is not None else ""
        raise ReplayError(f"{db} holds no trajectories{what} on {topic}: nothing to replay")
    members: dict[str, list[Episode]] = defaultdict(list)
    per_token = []
    for (gid, _), records in sorted(by_episode.items()):
        ep = episode(records)
        members[gid].append(ep)
        gen = records[0].timings.get("generate", 0.0)
        if ep.tokens and gen > 0:
            per_token.append(gen / ep.tokens)
    groups = [Group(g, tuple(members[g])) for g in sorted(members, key=lambda g: (first[g], g))]
    train_s, batch = trainer_log(where)
    notes = [f"{skipped} undecodable records skipped"] if skipped else []
    return Workload(groups, source=str(where), train_s=train_s, batch_groups=batch,
                    sec_per_token=statistics.median(per_token) if per_token else None,
                    notes=notes)
