"""What the injected faults did to a run, judged afterwards from its heartbeats (the ``Metric``
records every process sends to ``metrics`` about every 2 s, stamped with its pid and clock) and
the supervisor's restarts (pid changes of ``processes.json``, recorded by the injector).

Recovery time (docs/chaos.md), per fault:

* a kill (any timing): from the SIGKILL to the first heartbeat of the role's restarted process
  in state ``running``;
* ``blob_corrupt``: from the corruption to the first heartbeat of the worker killed right after
  it, restarted, reporting a weight version at least the corrupted one's (it synced around the
  bad blob);
* a lasting fault of the bus or the disk (``broker_restart``, a link of the broker,
  ``disk_full``): from the moment it was undone to the first heartbeat, stamped after that
  moment, of every role that heartbeated in the 30 s before the fault (of its restarted process
  if it died meanwhile) — the slowest role's;
* a lasting fault of the weight server's link: from the moment it was undone until every
  rollout worker reports (in a heartbeat) the version the trainer had reached by then.

Heartbeats are ~2 s apart, so recovery times are upper bounds with about that resolution.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.lib.chaos import KILLS, Fault, role_kind

ACTIVE_S = 30.0  # a role that heartbeated this recently before a fault is affected by it
SETTLE_S = 60.0  # a role's restarts this long after a lasting fault are the fault's doing


@dataclass(frozen=True)
class Beat:
    """One heartbeat: the emitter's clock, pid, role, status and gauges."""

    ts: float
    pid: int
    role: str
    status: str
    gauges: Mapping[str, float] = field(default_factory=dict)


def beats_from(metrics: Iterable[Any]) -> list[Beat]:
    """Heartbeats from decoded ``Metric`` records, in time order."""
    return sorted((Beat(m.ts, m.pid, m.role, m.status, dict(m.gauges)) for m in metrics),
                  key=lambda b: b.ts)


def owner(history: Mapping[str, Sequence[tuple[float, int]]]) -> dict[int, str]:
    """pid -> role name, from the supervisor's pid history."""
    return {pid: role for role, seen in history.items() for _, pid in seen}


def _pid_after(history: Sequence[tuple[float, int]], t: float, old: int) -> int | None:
    return next((pid for at, pid in history if at >= t - 1.0 and pid != old), None)


def _first(beats: Sequence[Beat], pid: int | None, after: float,
           ok: Any = lambda b: b.status == "running") -> float | None:
    if pid is None:
        return None
    return next((b.ts for b in beats if b.pid == pid and b.ts >= after and ok(b)), None)


def recover(faults: Sequence[Fault], beats: Sequence[Beat],
            history: Mapping[str, Sequence[tuple[float, int]]]) -> None:
    """Fill in each fault's ``recovery_s`` (None: not recovered before the run ended, or
    nothing to measure) and what it was measured on (``details["recovered_by"]``)."""
    pids = owner(history)
    for f in faults:
        if f.skipped is not None:
            continue
        if f.kind in KILLS:
            new = _pid_after(history.get(f.target, ()), f.t, f.details.get("pid", -1))
            f.details["new_pid"] = new
            at = _first(beats, new, f.t)
            f.recovery_s = None if at is None else round(at - f.t, 3)
            f.details["recovered_by"] = "first running heartbeat of the restarted process"
        elif f.kind == "blob_corrupt":
            role = f.details.get("forced_sync")
            new = _pid_after(history.get(role, ()), f.t, f.details.get("pid", -1)) \
                if role else None
            f.details["new_pid"] = new
            v = f.details.get("version", 0)
            at = _first(beats, new, f.t, lambda b, v=v: b.gauges.get("weight_version", -1) >= v)
            f.recovery_s = None if at is None else round(at - f.t, 3)
            f.details["recovered_by"] = (f"the restarted {role} reporting weight version >= "
                                         f"{v}")
            if at is None:  # what the restarted process did report: for the reader of a failure
                mine = [b for b in beats if b.pid == new and b.ts >= f.t]
                f.details["beats_after"] = len(mine)
                f.details["last_beat"] = None if not mine else {
                    "after_s": round(mine[-1].ts - f.t, 3), "status": mine[-1].status,
                    "weight_version": mine[-1].gauges.get("weight_version")}
        elif f.target.startswith("weights"):
            f.recovery_s = _weights_caught_up(f, beats, pids)
            f.details["recovered_by"] = "every rollout worker at the trainer's version"
        else:
            f.recovery_s = _all_beat_again(f, beats, history, pids)
            f.details["recovered_by"] = "a heartbeat from every active role"


def _all_beat_again(f: Fault, beats: Sequence[Beat],
                    history: Mapping[str, Sequence[tuple[float, int]]],
                    pids: Mapping[int, str]) -> float | None:
    end = f.end if f.end is not None else f.t
    active = {pids[b.pid] for b in beats if f.t - ACTIVE_S <= b.ts <= f.t and b.pid in pids}
    if "live" in f.details:  # the roles whose process was alive when the fault began
        active &= set(f.details["live"])
    worst = 0.0
    for role in sorted(active):
        mine = {pid for _, pid in history.get(role, ())}
        at = next((b.ts for b in beats if b.ts > end and b.pid in mine), None)
        if at is None:
            f.details.setdefault("not_recovered", []).append(role)
            return None
        worst = max(worst, at - end)
    return round(worst, 3)


def _weights_caught_up(f: Fault, beats: Sequence[Beat], pids: Mapping[int, str]
                       ) -> float | None:
    end = f.end if f.end is not None else f.t
    target = max((b.gauges.get("step", 0) for b in beats if b.role == "trainer" and b.ts <= end),
                 default=0)
    f.details["caught_up_to"] = target
    workers = {b.pid for b in beats if b.role == "rollout" and f.t - ACTIVE_S <= b.ts <= f.t}
    worst = 0.0
    for pid in sorted(workers):
        role = pids.get(pid)
        mine = {p for p, r in pids.items() if r == role} if role else {pid}
        at = next((b.ts for b in beats if b.pid in mine and b.ts >= end
                   and b.gauges.get("weight_version", -1) >= target), None)
        if at is None:
            f.details.setdefault("not_recovered", []).append(role or pid)
            return None
        worst = max(worst, at - end)
    return round(worst, 3)


# -- checks -----------------------------------------------------------------------------------

def versions_backwards(beats: Sequence[Beat]) -> list[str]:
    """Per process that reports weight versions (``weight_version.<policy>``: rollout workers,
    evaluators), in heartbeat order: every time a policy's version went down."""
    seq: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for b in beats:
        for k, v in b.gauges.items():
            if k.startswith("weight_version."):
                seq[(b.pid, k.removeprefix("weight_version."))].append((b.ts, v))
    bad = []
    for (pid, policy), rows in sorted(seq.items()):
        rows.sort()
        for (_, a), (ts, b) in zip(rows, rows[1:], strict=False):
            if b < a:
                bad.append(f"pid {pid} policy {policy}: {a:g} -> {b:g} at {ts:.1f}")
    return bad


def restarts(faults: Sequence[Fault], history: Mapping[str, Sequence[tuple[float, int]]],
             policies: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Per role: its restarts (pid changes) and what caused each: an injected kill of it, a
    lasting fault (a restart from its start until ``SETTLE_S`` after its end), or nothing
    (``unexplained``: a crash of its own, or a crash loop)."""
    out: dict[str, dict[str, Any]] = {}
    lasting = [(f.t, (f.end or f.t) + SETTLE_S, f.kind) for f in faults
               if f.skipped is None and f.kind not in KILLS]
    for role, seen in history.items():
        kills = sorted(f.t for f in faults if f.skipped is None and (
            (f.kind in KILLS and f.target == role)
            or (f.kind == "blob_corrupt" and f.details.get("forced_sync") == role)))
        row: dict[str, Any] = {"kind": role_kind(role, policies), "restarts": len(seen) - 1,
                               "injected": 0, "secondary": [], "unexplained": []}
        for at, _ in seen[1:]:
            k = next((t for t in kills if t <= at + 0.5), None)
            if k is not None:  # the supervisor's restart after this kill
                kills.remove(k)
                row["injected"] += 1
                continue
            cause = next((kind for t0, t1, kind in lasting if t0 <= at <= t1), None)
            row["secondary" if cause else "unexplained"].append(
                f"{cause} at {at:.1f}" if cause else f"{at:.1f}")
        out[role] = row
    return out
