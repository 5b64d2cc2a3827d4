"""A seeded fault injector for a live `astraflow run` (``bench/chaos.py``, docs/chaos.md).

It acts on a run from the outside, the way the world would: it reads the run directory's
``processes.json`` (role -> pid, rewritten by the supervisor on every restart) and

* ``kill``: SIGKILLs a role process at a random moment, a role of every kind in turn
  (producer, each policy stage, trainer, rollout worker, evaluator, ... as present);
* ``kill_in_checkpoint``: SIGKILLs a trainer or policy stage while its checkpoint is being
  written (its temporary file or directory exists);
* ``kill_after_checkpoint``: SIGKILLs it within milliseconds of a checkpoint becoming durable
  (renamed into place), that is while the cycle's outputs are produced and flushed and before
  its offsets are committed, in most cases;
* ``broker_restart``: stops the Kafka broker and starts it again (a ``LocalBroker``: data and
  ports kept);
* ``link_cut`` / ``link_stall`` / ``link_slow``: a Toxiproxy proxy in front of the broker or the
  weight server resets every connection, holds every byte (``timeout`` toxic), or adds a
  latency spike, for a while;
* ``disk_full``: fills the run directory's file system (a small loop-mounted one,
  :mod:`bench.lib.disk`) to its last byte for a while;
* ``blob_corrupt``: flips bytes of the newest published delta weight blob on disk (of a version
  without a full snapshot), then kills a rollout worker, whose restart must sync through it.

Every action is a :class:`Fault`, appended to a JSONL log as it happens. What the faults did to
the run (recovery times, crash loops) is judged afterwards from the run's heartbeats
(:mod:`bench.lib.recovery`). Standard library, core and :mod:`bench.lib.procs` only.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from astraflow.core.errors import AstraflowError
from bench.lib.procs import alive

log = logging.getLogger(__name__)

KILLS = ("kill", "kill_in_checkpoint", "kill_after_checkpoint")
LINKS = ("link_cut", "link_stall", "link_slow")
KINDS = (*KILLS, "broker_restart", *LINKS, "disk_full", "blob_corrupt")
_INSTANCE = re.compile(r"-(\d+)$")


class ChaosError(AstraflowError):
    """A fault kind that cannot be injected here, or a bad injector setting."""


def role_kind(name: str, policies: Sequence[str] = ()) -> str:
    """The kind of a supervisor role name: ``rollout-3`` -> ``rollout``,
    ``trainer-default`` -> ``trainer``, ``policy-batch-solver`` -> ``policy-batch``."""
    base = _INSTANCE.sub("", name)
    for p in sorted(policies, key=len, reverse=True):
        if base.endswith(f"-{p}"):
            return base[: -len(p) - 1]
    return base


@dataclass
class Fault:
    """One injected fault. ``t`` and ``end`` are ``time.time()``; ``end`` is when a fault that
    lasts (broker, link, disk) was undone, equal to ``t`` for an instant one (a kill).
    ``recovery_s`` is filled in after the run (:func:`bench.lib.recovery.recover`)."""

    id: int
    kind: str
    target: str
    t: float
    end: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    recovery_s: float | None = None
    skipped: str | None = None  # why nothing was injected (no such role, window missed, ...)

    def row(self) -> dict[str, Any]:
        return asdict(self)


def schedule(seed: int, rate_per_min: float, seconds: float, kinds: Sequence[str], *,
             start_s: float = 0.0, min_gap_s: float = 0.0) -> list[tuple[float, str]]:
    """The plan of a run: (seconds after the start, kind) with exponential gaps of mean
    ``60 / rate_per_min`` (at least ``min_gap_s``) from ``start_s`` until ``seconds``; the kinds
    taken in seeded shuffled rounds, so each one comes up about equally often."""
    if rate_per_min <= 0 or not kinds:
        raise ChaosError(f"schedule needs a positive rate and some kinds, got rate "
                         f"{rate_per_min} and kinds {list(kinds)}")
    bad = sorted(set(kinds) - set(KINDS))
    if bad:
        raise ChaosError(f"unknown fault kinds {bad}; valid: {', '.join(KINDS)}")
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    t = start_s
    deck: list[str] = []
    while True:
        t += max(min_gap_s, rng.expovariate(rate_per_min / 60.0))
        if t >= seconds:
            return out
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        out.append((round(t, 3), deck.pop()))


def read_pids(run_dir: Path) -> dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads((run_dir / "processes.json").read_text())
                .items()}
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


@dataclass
class Targets:
    """What the injector may act on besides the role processes (each optional).

    ``checkpoints``: role name -> where it checkpoints (a trainer's checkpoint root directory,
    or a policy stage's checkpoint file). ``broker``: an object with ``stop()`` and
    ``start()`` (a ``LocalBroker``). ``proxies``: name -> a :class:`~bench.lib.wan.Proxy`.
    ``disk``: an object with ``fill()`` and ``free()`` (:class:`~bench.lib.disk.LoopDisk`).
    ``weights``: the weight store's directory of blobs (``<store>/<policy>``)."""

    checkpoints: Mapping[str, Path] = field(default_factory=dict)
    broker: Any = None
    proxies: Mapping[str, Any] = field(default_factory=dict)
    disk: Any = None
    weights: Sequence[Path] = ()


class Injector:
    """Injects the faults of a :func:`schedule` into the run at ``run_dir``. :meth:`run` blocks
    (call it in a thread); :meth:`stop` ends it early. Faults never overlap: a lasting one
    blocks the next until it is undone.

    ``hold_s``: how long a lasting fault holds (drawn uniformly from the range).
    ``window_s``: how long a checkpoint-timed kill waits for its checkpoint.
    ``progress``: with it, the plan's times are trainer steps, not seconds: a fault is made
    once ``progress()`` (e.g. a :class:`StepWatch`) reaches its step, so where it lands in the
    run does not depend on the machine's speed. :attr:`done` is set once the plan is made."""

    def __init__(self, run_dir: Path, plan: Sequence[tuple[float, str]], *, seed: int,
                 log_path: Path, targets: Targets | None = None,
                 policies: Sequence[str] = ("default",),
                 hold_s: tuple[float, float] = (3.0, 10.0), window_s: float = 30.0,
                 slow_ms: tuple[int, int] = (300, 2000),
                 clock: Callable[[], float] = time.time,
                 progress: Callable[[], int] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.done = threading.Event()
        self.plan = list(plan)
        self.rng = random.Random(seed ^ 0x5EED)
        self.log_path = Path(log_path)
        self.targets = targets or Targets()
        self.policies = list(policies)
        self.hold_s = hold_s
        self.window_s = window_s
        self.slow_ms = slow_ms
        self.clock = clock
        self.faults: list[Fault] = []
        self.pid_history: dict[str, list[tuple[float, int]]] = {}
        self._stop = threading.Event()
        self._decks: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self.started: float | None = None

    # -- the loop ----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    def stopped(self) -> bool:
        return self._stop.is_set()

    def watch_pids(self) -> None:
        """Record every pid change of ``processes.json`` (the supervisor's restarts)."""
        now = self.clock()
        with self._lock:
            for role, pid in read_pids(self.run_dir).items():
                seen = self.pid_history.setdefault(role, [])
                if not seen or seen[-1][1] != pid:
                    seen.append((now, pid))

    def _sleep_until(self, t: float) -> bool:
        while not self._stop.is_set():
            self.watch_pids()
            left = t - self.clock()
            if left <= 0:
                return True
            self._stop.wait(min(0.1, left))
        return False

    def _wait_for_step(self, step: int) -> bool:
        assert self.progress is not None
        while not self._stop.is_set():
            self.watch_pids()
            if self.progress() >= step:
                return True
            self._stop.wait(0.1)
        return False

    def run(self) -> list[Fault]:
        """Inject the plan, timed from now; returns every fault (also on :attr:`faults`)."""
        self.started = self.clock()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for at, kind in self.plan:
            if not (self._wait_for_step(int(at)) if self.progress is not None
                    else self._sleep_until(self.started + at)):
                break
            fault = self.inject(kind)
            log.info("fault %s", json.dumps(fault.row()))
        self.done.set()
        while not self._stop.is_set():  # keep recording restarts until stopped
            self.watch_pids()
            self._stop.wait(0.2)
        return self.faults

    def inject(self, kind: str) -> Fault:
        """Inject one fault of ``kind`` now."""
        fault = Fault(id=len(self.faults), kind=kind, target="", t=self.clock())
        self.faults.append(fault)
        if kind not in KILLS:  # who is there to be affected (a finished producer is not)
            fault.details["live"] = sorted(self.live_roles())
        try:
            getattr(self, f"_{kind}")(fault)
        except (OSError, AstraflowError) as e:  # a fault that could not be made: logged
            fault.skipped = f"{type(e).__name__}: {e}"
        if fault.end is None and fault.skipped is None:
            fault.end = fault.t
        self._log(fault)
        return fault

    def _log(self, fault: Fault) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps(fault.row()) + "\n")

    def _hold(self) -> float:
        return round(self.rng.uniform(*self.hold_s), 2)

    # -- role processes ----------------------------------------------------------------------

    def live_roles(self) -> dict[str, int]:
        return {r: p for r, p in read_pids(self.run_dir).items() if alive(p)}

    def pick_role(self, only: Sequence[str] | None = None) -> str | None:
        """A live role, its kind taken in shuffled rounds over the kinds present (``only``:
        among these role names), the instance at random."""
        roles = [r for r in self.live_roles() if only is None or r in only]
        by_kind: dict[str, list[str]] = {}
        for r in sorted(roles):
            by_kind.setdefault(role_kind(r, self.policies), []).append(r)
        if not by_kind:
            return None
        key = ",".join(sorted(by_kind))
        deck = self._decks.setdefault(key, [])
        if not deck:
            deck.extend(sorted(by_kind))
            self.rng.shuffle(deck)
        return self.rng.choice(by_kind[deck.pop()])

    def kill_role(self, fault: Fault, role: str, pid: int | None = None) -> None:
        pid = pid if pid is not None else read_pids(self.run_dir).get(role)
        if pid is None or not alive(pid):
            raise ChaosError(f"role {role} has no live process (pid {pid})")
        os.kill(pid, signal.SIGKILL)
        fault.t = self.clock()
        fault.target = role
        fault.details.update(pid=pid, signal="SIGKILL", role_kind=role_kind(role, self.policies))

    def _kill(self, fault: Fault) -> None:
        role = self.pick_role()
        if role is None:
            raise ChaosError("no live role to kill")
        self.kill_role(fault, role)

    def _kill_in_checkpoint(self, fault: Fault) -> None:
        self._timed_kill(fault, during=True)

    def _kill_after_checkpoint(self, fault: Fault) -> None:
        self._timed_kill(fault, during=False)

    def _timed_kill(self, fault: Fault, *, during: bool) -> None:
        """Wait (polling every millisecond) for a checkpoint of a role that has one to be in
        progress (``during``) or to have just become durable, then SIGKILL that role."""
        role = self.pick_role(only=list(self.targets.checkpoints))
        if role is None:
            raise ChaosError("no live trainer or policy stage whose checkpoints are known")
        path = Path(self.targets.checkpoints[role])
        fault.target = role
        stale = _in_progress(path)  # left by a process killed while writing
        before = _durable_marker(path)
        deadline = time.monotonic() + self.window_s
        while time.monotonic() < deadline and not self._stop.is_set():
            hit = (sorted(_in_progress(path) - stale) if during
                   else [m] if (m := _durable_marker(path)) and m != before else [])
            if hit:
                self.kill_role(fault, role)
                fault.details["checkpoint"] = hit[0]
                return
            time.sleep(0.001)
        raise ChaosError(f"no checkpoint of {role} {'in progress' if during else 'completed'} "
                         f"within {self.window_s:.0f}s (at {path})")

    # -- broker, links, disk -----------------------------------------------------------------

    def _broker_restart(self, fault: Fault) -> None:
        broker = self.targets.broker
        if broker is None:
            raise ChaosError("no broker to restart (the embedded bus, or an external cluster)")
        fault.target = "broker"
        hold = self._hold()
        broker.stop()
        fault.details["stopped_s"] = round(self.clock() - fault.t, 3)
        self._stop.wait(hold)
        broker.start()
        fault.end = self.clock()
        fault.details["held_s"] = hold

    def _link(self, fault: Fault, how: str) -> None:
        if not self.targets.proxies:
            raise ChaosError("no proxied link (run the roles through Toxiproxy)")
        name = self.rng.choice(sorted(self.targets.proxies))
        proxy = self.targets.proxies[name]
        fault.target = name
        hold = self._hold()
        if how == "cut":
            proxy.cut()  # every connection reset, new ones too
            undo = proxy.restore
        elif how == "stall":  # bytes held, connections open, until removed
            toxic = proxy.add_toxic("timeout", stream="downstream", name="chaos_stall",
                                    timeout=0)
            undo = lambda: proxy.remove_toxic(toxic)  # noqa: E731
        else:
            ms = self.rng.randint(*self.slow_ms)
            fault.details["latency_ms"] = ms
            toxic = proxy.add_toxic("latency", stream="downstream", name="chaos_latency",
                                    latency=ms, jitter=ms // 4)
            undo = lambda: proxy.remove_toxic(toxic)  # noqa: E731
        self._stop.wait(hold)
        undo()
        fault.end = self.clock()
        fault.details["held_s"] = hold

    def _link_cut(self, fault: Fault) -> None:
        self._link(fault, "cut")

    def _link_stall(self, fault: Fault) -> None:
        self._link(fault, "stall")

    def _link_slow(self, fault: Fault) -> None:
        self._link(fault, "slow")

    def _disk_full(self, fault: Fault) -> None:
        disk = self.targets.disk
        if disk is None:
            raise ChaosError("no quota file system under the run directory")
        fault.target = str(disk.mountpoint)
        hold = self._hold()
        fault.details["filled_bytes"] = disk.fill()
        fault.t = self.clock()
        self._stop.wait(hold)
        disk.free()
        fault.end = self.clock()
        fault.details["held_s"] = hold

    # -- weights -----------------------------------------------------------------------------

    def _blob_corrupt(self, fault: Fault) -> None:
        after = max((f.details.get("version", 0) for f in self.faults
                     if f.kind == "blob_corrupt" and f.skipped is None and f is not fault),
                    default=0)
        blob = blob_to_corrupt(self.targets.weights, after=after)
        if blob is None:
            raise ChaosError(f"no delta weight blob past version {after} to corrupt (or none "
                             f"behind a full snapshot yet) under {[str(p) for p in self.targets.weights]}")
        fault.target = str(blob)
        fault.details.update(version=blob_version(blob),
                             flipped=flip_bytes(blob, self.rng, n=16))
        fault.t = self.clock()
        # a live worker may already hold this version; a restarted one syncs from its model
        # directory, and every route to this version or past it reads this blob
        role = self.pick_role(only=[r for r in self.live_roles()
                                    if role_kind(r, self.policies) == "rollout"])
        if role is not None:
            kill = Fault(id=-1, kind="kill", target="", t=0.0)
            self.kill_role(kill, role)
            fault.details.update(forced_sync=role, pid=kill.details["pid"], killed_at=kill.t)


class StepWatch:
    """The newest trainer step a run has reported: the largest ``step`` in its
    ``metrics.jsonl`` (the collector's copy of every heartbeat, the file the run's
    ``summary.json`` takes ``trainer_steps`` from), read on from where the last call ended.
    Calling it is cheap; a missing file or a line still being written counts as no step."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._step = 0

    def __call__(self) -> int:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self._step
        end = chunk.rfind(b"\n") + 1  # whole lines only
        for line in chunk[:end].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int | float):
                self._step = max(self._step, int(row["step"]))
        self._offset += end
        return self._step


def _in_progress(path: Path) -> set[str]:
    """The names of the checkpoints being written at ``path`` now: a trainer's
    ``.tmp-step-*`` directories, or a stage's ``.<file>.<pid>.tmp``."""
    try:
        if path.suffix != ".ckpt":  # a trainer's root (it may not exist yet)
            return {e.name for e in os.scandir(path) if e.name.startswith(".tmp-step-")}
        prefix = f".{path.name}."
        return {e.name for e in os.scandir(path.parent)
                if e.name.startswith(prefix) and e.name.endswith(".tmp")}
    except FileNotFoundError:
        return set()


def _durable_marker(path: Path) -> str:
    """What changes when a checkpoint becomes durable at ``path``: the newest ``step-*`` of a
    trainer's root, or the (inode, mtime) of a stage's file."""
    try:
        if path.suffix != ".ckpt":
            steps = [e.name for e in os.scandir(path) if e.name.startswith("step-")]
            return max(steps, default="")
        st = path.stat()
        return f"{st.st_ino}:{st.st_mtime_ns}"
    except FileNotFoundError:
        return ""


_BLOB = re.compile(r"^v(\d+)\.(full|delta)\.[0-9a-f]+\.afw$")


def blob_version(path: Path) -> int:
    m = _BLOB.match(path.name)
    return int(m.group(1)) if m else -1


def blob_to_corrupt(dirs: Sequence[Path], *, after: int = 0) -> Path | None:
    """The newest delta blob (``v<version>.delta.<hash>.afw``) of a version above ``after``
    that has no full snapshot and is not the newest version (whose full may still be being
    written): every route to that version or past it, until the next full snapshot, reads it.
    None also while no full snapshot lies above ``after`` (a corruption at ``after`` is still
    in every route: another one behind it would never be met)."""
    blobs = [(m, p) for d in dirs if Path(d).is_dir() for p in Path(d).iterdir()
             if (m := _BLOB.match(p.name))]
    if not blobs:
        return None
    newest = max(int(m.group(1)) for m, _ in blobs)
    fulls = {(p.parent, int(m.group(1))) for m, p in blobs if m.group(2) == "full"}
    if after and not any(v > after for _, v in fulls):
        return None
    deltas = [p for m, p in blobs if m.group(2) == "delta" and after < int(m.group(1)) < newest
              and (p.parent, int(m.group(1))) not in fulls]
    # of a version's blobs, the newest: a restarted trainer publishes the versions after its
    # checkpoint again, under new names, and workers follow the new manifests
    return max(deltas, key=lambda p: (blob_version(p), p.stat().st_mtime_ns), default=None)


def flip_bytes(path: Path, rng: random.Random, *, n: int = 16) -> list[int]:
    """Invert ``n`` bytes of ``path`` in place, at seeded offsets in its second half (the
    tensor data, past the header); returns the offsets."""
    size = path.stat().st_size
    offsets = sorted({rng.randrange(size // 2, size) for _ in range(n)})
    with path.open("r+b") as f:
        for off in offsets:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    return offsets
