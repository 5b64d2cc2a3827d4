"""The quickstart under faults (docs/chaos.md): `astraflow run` for ``--seconds`` of RL while a
seeded injector (bench/lib/chaos.py) SIGKILLs role processes of every kind (at random
moments, mid-checkpoint, right after a checkpoint), restarts the Kafka broker, cuts, stalls and
slows the broker's and the weight server's links through Toxiproxy, fills the run directory's
file system, and corrupts a published weight blob. Then it checks:

* accounting: unaccounted 0 and trained_twice 0 (produced = trained + waiting + filtered);
* versions: every process's weight versions (heartbeats) and every worker's recorded versions
  (trajectories, in the order it wrote them) never go backwards;
* crash loops: no role failed, every role alive or finished cleanly at the end, and every
  restart caused by an injected fault (none unexplained);
* replay: the trainer's final checkpoint equals, bit for bit, a fresh trainer built from the
  same starting weights and stepped in this process on exactly the batches the chaos trainer
  trained, in their order (the batches topic's order: one partition).

    python -m bench.chaos --warm runs/quickstart --seconds 420 --bus kafka --seed 1
    python -m bench.chaos --seconds 120 --bus embedded       # warm-up first, then chaos
    python -m bench.chaos --config examples/solver_verifier.yaml --seconds 300 --bus kafka

``--config``: another experiment than the quickstart, e.g. the solver + verifier team (every
policy's trainer, batch stage and evaluator are killed too, and every trainer is replayed).

Writes ``<out>/chaos.json`` (the fault log with recovery times, accounting, checks) and prints
the "Faults survived" table (docs/chaos.md). Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from astraflow.core.jsonl import log_rows
from astraflow.core.launcher import cli
from astraflow.core.ports import free_ports
from bench.lib.arms import (
    ROOT,
    arm_config,
    cli_run_args,
    make_warm,
    read_yaml,
    warm_models,
    write_yaml,
)
from bench.lib.chaos import KINDS, Fault, Injector, StepWatch, Targets, schedule
from bench.lib.runlog import read_summary

QUICKSTART = ROOT / "examples" / "quickstart.yaml"
LABELS = {
    "kill": "SIGKILL a random role (random moment)",
    "kill_in_checkpoint": "SIGKILL a trainer/stage while its checkpoint is written",
    "kill_after_checkpoint": "SIGKILL a trainer/stage right after a checkpoint (before commit)",
    "broker_restart": "Kafka broker stopped and restarted",
    "link_cut": "link reset (Toxiproxy reset_peer)",
    "link_stall": "link stalled (Toxiproxy timeout)",
    "link_slow": "link latency spike",
    "disk_full": "run directory's file system full",
    "blob_corrupt": "weight blob corrupted on disk",
}


# -- the run -------------------------------------------------------------------------------------

class Setup:
    """Everything around the run the faults act on: the run directory (on a quota file system
    when possible), the broker and its proxy (Kafka), the weight server and its proxy."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root: Path = args.out / "disk"  # the quota file system, when there is one
        self.run_dir = self.root / "run"
        self.store = self.root / "weights"  # the weight store, outside the run directory
        self.disk: Any = None
        self.broker: Any = None
        self.toxiproxy: Any = None
        self.proxies: dict[str, Any] = {}
        self.server: Any = None
        self.bus_url = ""
        self.direct_url = ""
        self.notes: list[str] = []

    def open(self, kinds: Sequence[str]) -> list[str]:
        """Make what ``kinds`` need; returns the kinds that can be injected (the others are
        noted with the reason)."""
        a = self.args
        if self.root.exists():
            shutil.rmtree(self.root)
        kinds = list(kinds)
        if "disk_full" in kinds:
            from bench.lib.disk import LoopDisk, can_mount

            why = can_mount()
            if why is None:
                self.disk = LoopDisk(self.root, size_mb=a.disk_mb)
                self.disk.open()
            else:
                self.notes.append(f"disk_full skipped: {why}")
                kinds.remove("disk_full")
        self.store.mkdir(parents=True, exist_ok=True)
        links = [k for k in kinds if k.startswith("link_")]
        if links:
            from bench.lib.wan import INSTALL_HINT, Toxiproxy, find_toxiproxy

            if find_toxiproxy() is None:
                self.notes.append(f"link faults skipped: {INSTALL_HINT}")
                kinds = [k for k in kinds if k not in links]
            else:
                self.toxiproxy = Toxiproxy()
                self.toxiproxy.start()
        if a.bus == "kafka":
            self._kafka(kinds)
        else:
            self.bus_url = self.direct_url = "embedded://{out}/bus.db"
            if "broker_restart" in kinds:
                self.notes.append("broker_restart skipped: the embedded bus has no broker")
                kinds.remove("broker_restart")
        if self.toxiproxy is not None:
            self._weight_server()
        return kinds

    def _kafka(self, kinds: list[str]) -> None:
        from astraflow.core.broker import LocalBroker

        a = self.args
        if a.bootstrap:  # someone else's broker: reached through a proxy if its WAN listener
            # is given (bind port, advertised), never restarted here
            self.direct_url = f"kafka://{a.bootstrap}"
            if "broker_restart" in kinds:
                self.notes.append("broker_restart skipped: the broker is not this bench's")
                kinds.remove("broker_restart")
            listener = a.wan_listener
        else:
            bind, advertised, port = free_ports(3)  # three distinct ports
            self.broker = LocalBroker(a.out / "kafka", port=port,
                                      extra_listeners={"CHAOS": (bind, f"127.0.0.1:{advertised}")})
            self.broker.start(timeout=120)
            self.direct_url = f"kafka://{self.broker.bootstrap}"
            listener = (bind, f"127.0.0.1:{advertised}")
        self.bus_url = self.direct_url
        if self.toxiproxy is not None and listener is not None:
            bind, advertised = listener
            self.proxies["kafka"] = self.toxiproxy.proxy("kafka", upstream=f"127.0.0.1:{bind}",
                                                         listen=advertised)
            self.bus_url = f"kafka://{advertised}"

    def _weight_server(self) -> None:
        from astraflow.weights.server import make_server

        self.server = make_server(self.store, host="127.0.0.1", port=0)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.proxies["weights"] = self.toxiproxy.proxy(
            "weights", upstream=self.server.url.removeprefix("http://"))

    def overrides(self) -> list[str]:
        sets = [f"bus.url={self.bus_url}", f"weights.store.path={self.store}"]
        if "weights" in self.proxies:
            sets.append(f"weights.fetch={{type: http, url: 'http://{self.proxies['weights'].listen}'}}")
        return sets

    def close(self) -> None:
        if self.toxiproxy is not None:
            self.toxiproxy.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.broker is not None:
            self.broker.stop()
        if self.disk is not None:
            keep = self.args.out / "kept"
            shutil.rmtree(keep, ignore_errors=True)
            keep.mkdir(parents=True)
            for name in ("summary.json", "metrics.jsonl", "processes.json", "config-rl.yaml"):
                if (self.run_dir / name).exists():
                    shutil.copy2(self.run_dir / name, keep / name)
            for log in self.run_dir.glob("trainer-*.jsonl"):
                shutil.copy2(log, keep / log.name)
            if (self.run_dir / "logs").exists():
                shutil.copytree(self.run_dir / "logs", keep / "logs")
            self.disk.close()


def targets(config: Any, run_dir: Path, setup: Setup) -> Targets:
    from astraflow.run.roles import configured_checkpoint_path

    ck: dict[str, Path] = {}
    for p in config.policies:
        ck[f"trainer-{p}"] = config.trainer_for(p).checkpoint_root(run_dir, p)
        ck[f"policy-batch-{p}"] = configured_checkpoint_path(config, "batch", p, run_dir)
    if config.data.pre_rollout:
        ck["policy-pre"] = configured_checkpoint_path(config, "pre_rollout", None, run_dir)
    ck["policy-post"] = configured_checkpoint_path(config, "post_rollout", None, run_dir)
    return Targets(checkpoints=ck, broker=setup.broker, proxies=setup.proxies, disk=setup.disk,
                   weights=[setup.store / p for p in config.policies])


def run_with_faults(cfg: Path, setup: Setup, plan: Sequence[tuple[float, str]], *, seed: int,
                    hold_s: tuple[float, float], log: Path, timeout: float,
                    steps_after: int | None = None) -> tuple[int, Injector]:
    """`astraflow run` of ``cfg`` with an injector following ``plan`` (timed from the moment
    the roles start); returns the run's exit code and the injector.

    ``steps_after``: the plan's times are trainer steps (see :class:`StepWatch`), and the run
    is stopped (SIGINT, the graceful way) once the plan is made and the trainer has gone
    ``steps_after`` steps past the last fault's step and past every corrupted version: how
    far the run gets is then a count, not the machine's speed (``launch.timeout_s`` and
    ``timeout`` stay as guards against a hang)."""
    from astraflow.config import load_experiment

    run_dir = setup.run_dir
    cmd = cli(*cli_run_args(cfg, run_dir))  # an arm's directory: a rerun replaces it
    print(f"  $ astraflow run {cfg} --out {run_dir} --no-live --fresh", flush=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    injector: Injector | None = None
    thread = None
    deadline = time.monotonic() + timeout
    steps = StepWatch(run_dir / "metrics.jsonl") if steps_after is not None else None
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if injector is None and (run_dir / "processes.json").exists():
                config = load_experiment(run_dir / "config-rl.yaml")
                injector = Injector(run_dir, plan, seed=seed,
                                    log_path=setup.args.out / "faults.jsonl",
                                    targets=targets(config, run_dir, setup),
                                    policies=config.policies, hold_s=hold_s, progress=steps)
                thread = threading.Thread(target=injector.run, daemon=True)
                thread.start()
            if steps is not None and injector is not None and injector.done.is_set():
                goal = steps_after + max([int(t) for t, _ in plan] + [
                    int(f.details.get("version", 0)) for f in injector.faults
                    if f.kind == "blob_corrupt"])  # type: ignore[operator]
                if steps() >= goal:
                    print(f"  trainer step {steps()} >= {goal}: stopping the run", flush=True)
                    proc.send_signal(2)
                    proc.wait(300)
                    break
            time.sleep(0.2)
        if proc.poll() is None:
            print(f"  the run did not end in {timeout:.0f}s: interrupting it", flush=True)
            proc.send_signal(2)
            proc.wait(120)
    finally:
        if injector is not None:
            injector.stop()
            assert thread is not None
            thread.join(60)
    if injector is None:
        raise SystemExit(f"the run never started its roles; see {log}")
    return proc.returncode, injector


# -- the checks ----------------------------------------------------------------------------------

def heartbeats(bus: Any, run: str) -> list[Any]:
    from astraflow.core.records import Metric
    from astraflow.core.topics import topic_name
    from astraflow.run.accounting import read_topic
    from bench.lib.recovery import beats_from

    return beats_from(m for _, _, m in read_topic(bus, topic_name(run, "metrics"), Metric))


def recorded_versions_backwards(bus: Any, run: str) -> list[str]:
    """Per rollout process (worker id), in the order it wrote its trajectories
    (``created_at``; each partition's offsets must agree): any policy's recorded version
    going down."""
    from astraflow.core.records import Trajectory
    from astraflow.core.topics import topic_name
    from astraflow.run.accounting import read_topic

    rows: dict[str, list[tuple[float, int, int, dict[str, int]]]] = defaultdict(list)
    for part, off, t in read_topic(bus, topic_name(run, "trajectories"), Trajectory):
        rows[t.worker_id].append((t.created_at, part, off, dict(t.version_vector)))
    return versions_going_back(rows)


def versions_going_back(rows: Mapping[str, list[tuple[float, int, int, dict[str, int]]]]
                        ) -> list[str]:
    bad = []
    for worker, seq in rows.items():
        seq = sorted(seq)
        last: dict[int, int] = {}
        for _, part, off, _ in seq:
            if off <= last.get(part, -1):
                bad.append(f"{worker}: partition {part} offset {off} out of created_at order")
            last[part] = off
        for p in {k for *_, v in seq for k in v}:
            vs = [v.get(p, 0) for *_, v in seq]
            bad += [f"{worker} {p}: {a} -> {b}" for a, b in zip(vs, vs[1:], strict=False)
                    if b < a]
    return bad


def trained_sequence(bus: Any, config: Any, policy: str, upto: Mapping[int, int]
                     ) -> tuple[list[Any], str | None]:
    """The batches the trainer of ``policy`` trained, in order: ``batches.<policy>`` below
    ``upto`` (partition -> offset: its final checkpoint's), each id once (its dedup); or a
    reason the order is unknown."""
    from astraflow.core.records import Batch
    from astraflow.core.topics import topic_name
    from astraflow.run.accounting import read_topic

    topic = topic_name(config.run, "batches", policy)
    parts = {p for p, e in bus.describe_topic(topic).end_offsets.items() if e}
    if len(parts) > 1:
        return [], f"{topic} has records on {len(parts)} partitions: no single order"
    seen: set[str] = set()
    seq = []
    for part, off, b in sorted(read_topic(bus, topic, Batch), key=lambda r: (r[0], r[1])):
        if off < upto.get(part, 0) and b.policy == policy and b.id not in seen:
            seen.add(b.id)
            seq.append(b)
    return seq, None


def replay(bus: Any, config: Any, run_dir: Path, policy: str) -> dict[str, Any]:
    """Train a fresh trainer, here, on the chaos trainer's batches in order, and compare its
    weights with the chaos trainer's final checkpoint, tensor by tensor, bit for bit."""
    import torch
    from safetensors.torch import load_file

    from astraflow.consumers.trainer.build import build_train_state, step_function
    from astraflow.consumers.trainer.loop import resolve
    from astraflow.run.launch import newest_checkpoint
    from astraflow.run.resources import model_dir
    from astraflow.run.roles import claims

    tc = config.trainer_for(policy)
    ck = newest_checkpoint(tc.checkpoint_root(run_dir, policy))
    if ck is None:
        return {"ok": False, "reason": "the trainer left no checkpoint"}
    from astraflow.core.topics import group_name, topic_name

    meta = json.loads((ck / "meta.json").read_text())
    version = int(meta["version"])
    topic = topic_name(config.run, "batches", policy)
    # the checkpoint says what the weights hold; the group's commit follows it (it lags when
    # the run stopped before a restarted trainer was given its partition back)
    upto = {int(p): int(o) for p, o in meta["offsets"].get(topic, {}).items()}
    committed = bus.committed(group_name(config.run, "trainer", policy=policy), topic)
    seq, why = trained_sequence(bus, config, policy, upto)
    if why is not None:
        return {"ok": None, "reason": why}
    if len(seq) != version:
        return {"ok": False, "reason": f"checkpoint at version {version} holds offsets {upto} "
                                       f"of {topic}: {len(seq)} distinct batches below them"}
    order = _logged_order(run_dir / f"trainer-{policy}.jsonl", seq[:version])
    state = build_train_state(tc, model_dir(config, policy, run_dir))
    step = step_function(tc.mode)
    store = claims(config, run_dir)
    # the trajectories read once (fetching each batch's 512 references through a reader of
    # their own took ~15 s a batch on Kafka); a batch with a claimed record (not decodable
    # as it lies on the topic) goes through the trainer's own resolve
    index = trajectories_by_address(bus, config.run)
    t0 = time.monotonic()
    for v, b in enumerate(seq[:version]):
        local = all((r.topic, r.partition, r.offset) in index for g in b.groups for r in g.refs)
        step(state, resolve_from(index, b) if local else resolve(bus, b, store), v)
    final = load_file(str(ck / "model.safetensors"))
    mine = {k: v.detach().cpu() for k, v in state.model.state_dict().items()}
    names = sorted(set(final) & set(mine))
    diff = [k for k in names if not torch.equal(final[k], mine[k])]
    worst = max((float((final[k] - mine[k]).abs().max()) for k in diff), default=0.0)
    return {"ok": not diff and len(names) == len(final), "steps": version,
            "tensors": len(names), "tensors_differing": len(diff), "max_abs_diff": worst,
            "compared": "bitwise (torch.equal on every fp32 master tensor)",
            "replay_s": round(time.monotonic() - t0, 1), "logged_order_mismatches": order,
            "checkpoint": str(ck), "checkpoint_offsets": upto,
            "committed_offsets": dict(committed)}


def trajectories_by_address(bus: Any, run: str) -> dict[tuple[str, int, int], Any]:
    from astraflow.core.records import Trajectory
    from astraflow.core.topics import topic_name
    from astraflow.run.accounting import read_topic

    topic = topic_name(run, "trajectories")
    return {(topic, p, o): t for p, o, t in read_topic(bus, topic, Trajectory)}


def resolve_from(index: Mapping[tuple[str, int, int], Any], batch: Any) -> Any:
    """``batch`` with its references replaced by the trajectories of ``index``, as the
    trainer's ``resolve`` builds it from the bus (the same ``assemble``)."""
    from astraflow.consumers.trainer.loop import assemble

    return assemble(batch, lambda topic, part, off: index[(topic, part, off)])


def _logged_order(path: Path, seq: Sequence[Any]) -> list[str]:
    """The trainer's own log (the last line of each step: steps after a checkpoint are
    trained again after a crash) against the sequence the replay uses."""
    last: dict[int, str] = {}
    for r in log_rows(path):
        if "step" in r and "batch_id" in r:
            last[int(r["step"])] = str(r["batch_id"])
    return [f"step {v + 1}: log {last.get(v + 1)} replay {b.id}" for v, b in enumerate(seq)
            if last.get(v + 1, b.id) != b.id]


#: a published manifest as :func:`superseded` reads it: (version, kind, when, blob file name)
Published = tuple[int, str, float, str]


def published(bus: Any, config: Any) -> dict[str, list[Published]]:
    """Per policy, every manifest published, from the bus (the store prunes old blobs, the
    topic keeps them)."""
    from astraflow.core.records import WeightManifest
    from astraflow.core.topics import topic_name
    from astraflow.run.accounting import read_topic

    return {p: [(m.version, m.kind, m.created_at, Path(m.tensors[0].uri).name)
                for _, _, m in read_topic(bus, topic_name(config.run, "weights", p),
                                          WeightManifest)]
            for p in config.policies}


def detections(run_dir: Path, faults: Sequence[Fault],
               manifests: Mapping[str, Sequence[Published]]) -> None:
    """Each ``blob_corrupt`` fault's evidence in the role logs: the syncers' ``heal`` warnings
    naming the corrupted version, logged after the corruption (``details["detected"]``)."""
    import datetime
    import re

    lines = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) WARNING "
                         r"astraflow\.weights\.syncer heal policy=\S+ version=(\d+)", line)
            if m:
                ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
                lines.append((ts + int(m.group(2)) / 1000, int(m.group(3)), log.stem))
    for f in faults:
        if f.kind == "blob_corrupt" and f.skipped is None:
            hits = [(role, round(ts - f.t, 2)) for ts, v, role in lines
                    if v == f.details.get("version") and ts >= f.t - 1]
            f.details["detected"] = len(hits)
            f.details["detected_by"] = sorted({r for r, _ in hits})
            f.details["first_detection_s"] = min((d for _, d in hits), default=None)
            f.details["superseded"] = superseded(
                f, manifests.get(Path(f.target).parent.name, ()))


def superseded(f: Fault, manifests: Sequence[Published]) -> bool:
    """Was the corrupted blob passed over rather than met: before the worker restarted through
    it synced past its version, was there published (``manifests``: its policy's) a full
    snapshot of a later version (routes then start at that full), or a new chain past it — a
    trainer restarted from a checkpoint at or below its version republished from there (a
    manifest of a version <= it, after it) and reached its version (a manifest >= it, after it;
    the same version under another name, or a later one when the restarted publisher coalesced
    versions: routes take the later manifests, so they follow the new chain)? Then no route
    reads the blob."""
    if f.recovery_s is None:
        return False
    synced = f.t + f.recovery_s
    version, name = f.details.get("version", 0), Path(f.target).name
    mine = min((at for _, _, at, uri in manifests if uri == name), default=None)
    if any(at <= synced and kind == "full" and v > version for v, kind, at, _ in manifests):
        return True
    if mine is None:
        return False
    later = [(v, at) for v, _, at, uri in manifests if uri != name and mine < at <= synced]
    return any(v <= version for v, _ in later) and any(v >= version for v, _ in later)


def last_start(run_dir: Path, role: str | None, lines: int = 15) -> list[str]:
    """The last ``lines`` lines ``role``'s log holds since its last start (the supervisor
    writes ``=== start`` before each): what a restarted process said, for the reader of a
    failed check (the run's disk is gone by then)."""
    if role is None or not (log := run_dir / "logs" / f"{role}.log").exists():
        return []
    text = log.read_text(errors="replace").rsplit("=== start", 1)[-1]
    return [line[:300] for line in text.splitlines()[-lines:]]


def trainer_progress(run_dir: Path, policy: str, t: float) -> dict[str, Any]:
    """What ``policy``'s trainer did around time ``t``, from its own log
    (``trainer-<policy>.jsonl``): each start (seconds after ``t``, version resumed at) and its
    last step (step, seconds after ``t``). Both CI runs where a corruption went unseen ended
    with the trainer's newest checkpoint a few versions past the corrupted one, where other
    runs reach ~400: this says whether the trainer stopped, and when."""
    starts, last = [], None
    for r in log_rows(run_dir / f"trainer-{policy}.jsonl"):
        when = round(float(r.get("time", t)) - t, 1)
        if r.get("event") == "start":
            starts.append((when, r.get("version")))
        elif "step" in r:
            last = (int(r["step"]), when)
    return {"starts": starts, "last_step": last}


def undetected_details(f: Fault, run_dir: Path, manifests: Mapping[str, Sequence[Published]]
                       ) -> dict[str, Any]:
    """What a ``blob_corrupt`` fault neither detected nor passed over left to go on: its
    restarted worker's heartbeats and log, the manifests (version, kind, seconds after the
    fault, blob) of its policy published from 5 s before it, and what its policy's trainer
    did (:func:`trainer_progress`, and its log since its last start)."""
    policy = Path(f.target).parent.name
    return {k: f.details.get(k) for k in ("version", "new_pid", "beats_after", "last_beat",
                                          "superseded")} | {
        "recovery_s": f.recovery_s,
        "log_of_restart": last_start(run_dir, f.details.get("forced_sync")),
        "manifests": [(v, kind, round(at - f.t, 1), uri) for v, kind, at, uri
                      in manifests.get(policy, ()) if at >= f.t - 5][:40],
        "trainer": trainer_progress(run_dir, policy, f.t),
        "trainer_log": last_start(run_dir, f"trainer-{policy}")}


def crash_loops(summary: Mapping[str, Any], causes: Mapping[str, Mapping[str, Any]]
                ) -> list[str]:
    bad = [f"{r} failed (restarts exhausted)" for r in summary.get("failed_roles", [])]
    for role, st in summary.get("roles", {}).items():
        if st.get("exit") not in (0, None):
            bad.append(f"{role} ended with exit {st.get('exit')}")
    for role, c in causes.items():
        if c["unexplained"]:
            bad.append(f"{role} restarted with no fault to explain it at {c['unexplained']}")
    return bad


def check(bus: Any, config: Any, run_dir: Path, injector: Injector, rc: int,
          skip_replay: bool = False) -> dict[str, Any]:
    from astraflow.run.accounting import account
    from bench.lib.recovery import recover, restarts, versions_backwards

    summary = read_summary(run_dir)
    acc = summary.get("accounting") or account(bus, config)
    beats = heartbeats(bus, config.run)
    recover(injector.faults, beats, injector.pid_history)
    manifests = published(bus, config)
    detections(run_dir, injector.faults, manifests)
    causes = restarts(injector.faults, injector.pid_history, config.policies)
    back = versions_backwards(beats) + recorded_versions_backwards(bus, config.run)
    loops = crash_loops(summary, causes)
    undetected = [f.id for f in injector.faults if f.kind == "blob_corrupt"
                  and f.skipped is None and not f.details.get("detected")
                  and not f.details.get("superseded")]
    replays = {} if skip_replay else {p: replay(bus, config, run_dir, p)
                                      for p in config.policies}
    checks = {
        "run_exit": {"ok": rc == 0, "exit": rc},
        "accounting": {"ok": lost(acc) == 0 and acc.get("trained_twice") == 0
                       and acc.get("produced", 0) > 0, "lost": lost(acc),
                       **{k: acc.get(k) for k in ("produced", "unaccounted", "trained_twice")}},
        "versions_monotonic": {"ok": not back, "violations": back[:20]},
        "no_crash_loop": {"ok": not loops, "problems": loops},
        "corruption_detected": {
            "ok": not undetected, "undetected_faults": undetected,
            # what each such fault's restarted worker did (for the reader of a failure)
            "their_details": {f.id: undetected_details(f, run_dir, manifests)
                              for f in injector.faults if f.id in undetected}},
        "replay": {"ok": all(r.get("ok") is not False for r in replays.values())
                   and not any(r.get("logged_order_mismatches") for r in replays.values()),
                   **replays},
    }
    return {"checks": checks, "accounting": acc, "restarts": causes,
            "trainer_steps": summary.get("trainer_steps")}


# -- the table -----------------------------------------------------------------------------------

def lost(acc: Mapping[str, Any]) -> int:
    """Trajectories lost to training: unaccounted, or consumed by the trainer in a batch it
    dead-lettered (its records could not be fetched)."""
    from astraflow.run.accounting import DEAD_LETTERED

    return int(acc.get("unaccounted", 0)) + int(acc.get(DEAD_LETTERED, 0))


def fault_rows(faults: Sequence[Fault], acc: Mapping[str, Any]) -> list[dict[str, Any]]:
    by: dict[str, list[Fault]] = defaultdict(list)
    for f in faults:
        by[f.kind].append(f)
    rows = []
    for kind in KINDS:
        fs = by.get(kind, [])
        if not fs:
            continue
        done = [f for f in fs if f.skipped is None]
        rec = sorted(f.recovery_s for f in done if f.recovery_s is not None)
        targets = sorted({f.details.get("role_kind", f.target) for f in done})
        rows.append({"kind": kind, "injected": len(done), "skipped": len(fs) - len(done),
                     "targets": targets, "recovered": len(rec),
                     "p50_s": rec[len(rec) // 2] if rec else None,
                     "max_s": rec[-1] if rec else None,
                     "lost": lost(acc), "twice": acc.get("trained_twice")})
    return rows


def table(rows: Sequence[Mapping[str, Any]], command: str) -> str:
    lines = ["| fault | injected | targets | lost | repeated in training | recovered | "
             "time to recover p50 / max |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        t = "-" if r["p50_s"] is None else f"{r['p50_s']:.1f} s / {r['max_s']:.1f} s"
        missed = f" (+{r['skipped']} missed)" if r["skipped"] else ""
        lines.append(f"| {LABELS.get(r['kind'], r['kind'])} | {r['injected']}{missed} | "
                     f"{', '.join(r['targets'])} | {r['lost']} | {r['twice']} | "
                     f"{r['recovered']}/{r['injected']} | {t} |")
    lines.append(f"\n`{command}`")
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------

def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=360.0, help="RL seconds under faults")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=4.0, help="faults per minute (mean)")
    ap.add_argument("--bus", choices=("embedded", "kafka"), default="embedded")
    ap.add_argument("--kinds", default=",".join(KINDS), help="fault kinds to inject")
    ap.add_argument("--startup", type=float, default=25.0,
                    help="seconds after the roles start before the first fault")
    ap.add_argument("--hold", default="3,10", help="a lasting fault holds MIN,MAX seconds")
    ap.add_argument("--min-gap", type=float, default=4.0, help="seconds between faults")
    ap.add_argument("--disk-mb", type=int, default=4096,
                    help="size of the run directory's own file system (disk_full)")
    ap.add_argument("--bootstrap", default=None,
                    help="an existing broker (kafka): never restarted")
    ap.add_argument("--wan-listener", default=None, type=lambda s: (int(s.split(",")[0]),
                                                                  s.split(",")[1]),
                    help="BIND_PORT,ADVERTISED of that broker's extra listener to proxy")
    ap.add_argument("--config", type=Path, default=QUICKSTART,
                    help="the experiment run under faults (default: the quickstart)")
    ap.add_argument("--warm", type=Path, default=None,
                    help="a finished run of the experiment whose warm models to reuse; "
                         "'none': RL from the models as built")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-chaos")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="config override (also for the warm-up)")
    ap.add_argument("--plan", default=None, help="a fixed plan instead of the seeded one: "
                                                 "SECONDS:KIND,... (tests)")
    ap.add_argument("--steps-after", type=int, default=None,
                    help="count in trainer steps, not seconds: --plan's times are steps, and "
                         "the run stops this many steps past the last fault and every "
                         "corrupted version (--seconds is then only a hang guard)")
    ap.add_argument("--no-replay", action="store_true")
    return ap.parse_args(argv)


CHAOS_SETS = [
    "launch.max_restarts=1000",  # the injector kills roles on purpose; loops are judged here
    "trainer.checkpoint_every=10",  # checkpoints often enough to be hit
    "launch.eval_problems=100", "launch.eval_nice=0",
]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.steps_after is not None and not args.plan:
        raise SystemExit("--steps-after counts the plan in trainer steps: give one with --plan "
                         "STEP:KIND,...")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "faults.jsonl").unlink(missing_ok=True)
    base = read_yaml(args.config)
    if args.warm is not None and str(args.warm) == "none":
        from astraflow.core.config import apply_overrides

        data = apply_overrides(base, [*args.sets, "launch.warmup.steps=0"])
        data["launch"]["timeout_s"] = args.seconds
    else:
        warm = warm_models(args.warm or make_warm(base, args.sets, args.out))
        data = arm_config(base, args.sets, warm, seconds=args.seconds, latency=None,
                          workflow=base.get("rollout", {}).get("workflow", {}).get(
                              "default", "single_turn"), latency_key="latency")
    from astraflow.core.config import apply_overrides

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    setup = Setup(args)
    command = "python -m bench.chaos " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        if args.plan:
            plan = [(float(t), k) for t, k in (x.split(":") for x in args.plan.split(","))]
            kinds = sorted({k for _, k in plan})
        kinds = setup.open(kinds)
        data = apply_overrides(data, [*CHAOS_SETS, *setup.overrides(), f"run=chaos{args.seed}"
                                      f"x{int(time.time()) % 100000}", *args.sets])
        cfg = write_yaml(data, args.out / "chaos.yaml")
        if not args.plan:
            plan = schedule(args.seed, args.rate, args.seconds - 10, kinds,
                            start_s=args.startup, min_gap_s=args.min_gap)
        print(f"plan ({len(plan)} faults): {plan}", flush=True)
        for n in setup.notes:
            print(f"  note: {n}", flush=True)
        hold = tuple(float(x) for x in args.hold.split(","))
        t0 = time.monotonic()
        rc, injector = run_with_faults(cfg, setup, plan, seed=args.seed, hold_s=hold,  # type: ignore[arg-type]
                                       log=args.out / "run.log", timeout=args.seconds + 600,
                                       steps_after=args.steps_after)
        print(f"[chaos] astraflow run exit {rc} in {time.monotonic() - t0:.0f} s", flush=True)
        result = analyse(args, setup, injector, rc, command)
    finally:
        setup.close()
    return 0 if all(c["ok"] is not False for c in result["checks"].values()) else 1


def analyse(args: argparse.Namespace, setup: Setup, injector: Injector, rc: int,
            command: str) -> dict[str, Any]:
    from astraflow.config import load_experiment
    from astraflow.core.bus import open_bus

    if setup.proxies:  # every link whole again for the reads below
        setup.toxiproxy.reset()
    config = load_experiment(setup.run_dir / "config-rl.yaml")
    bus = open_bus(setup.direct_url, setup.run_dir)
    try:
        res = check(bus, config, setup.run_dir, injector, rc, skip_replay=args.no_replay)
    finally:
        bus.close()
    rows = fault_rows(injector.faults, res["accounting"])
    md = table(rows, command)
    result = {"command": command, "seed": args.seed, "rate": args.rate, "bus": args.bus,
              "seconds": args.seconds, "notes": setup.notes, "faults_survived": rows,
              "faults": [f.row() for f in injector.faults],
              "pid_history": injector.pid_history, **res}
    (args.out / "chaos.json").write_text(json.dumps(result, indent=1, default=str))
    print(md)
    for name, c in res["checks"].items():
        print(f"check {name}: {'ok' if c['ok'] else 'n/a' if c['ok'] is None else 'FAILED'} "
              f"{json.dumps({k: v for k, v in c.items() if k != 'ok'}, default=str)[:600]}")
    print(f"summary: {args.out / 'chaos.json'}")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
