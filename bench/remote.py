"""Remote rollout over an emulated WAN: does the trainer wait more when two of three rollout
workers sit behind a far link, and does a regional mirror keep the trainer's egress flat?

    scripts/install-toxiproxy.sh                 # once (Go builds toxiproxy-server)
    python -m bench.remote                       # warm-up once, then the three arms + egress
    python -m bench.remote --warm runs/quickstart --seconds 120

**Part 1, trainer wait.** The quickstart on a local Kafka broker (started here) from one warm
model, ``--seconds`` of RL per arm, three rollout workers of unequal speed (``--speeds``
100/60/30%: a worker at speed s waits ``--latency``/s per generate request and its engine's
own compute is slowed to s, ``rollout.engine.speed``: a weaker accelerator). The run's own
worker is the full-speed one, next to the trainer; the bench starts the other two:

* ``local``: next to the trainer too (the broker's own listener, the run's store as a
  directory);
* ``remote``: "in another region": their Kafka traffic goes through a Toxiproxy proxy to a
  broker listener that advertises the proxy's address, their weights come from the run's
  store served over HTTP through a second proxy; both links have ``--rtt-ms`` round trip and
  the scaled bandwidth below; sparse bf16 deltas (a full every 20 versions);
* ``remote-full``: the same, but every version a full snapshot (``weights.max_delta_fraction``
  near 0: no delta is small enough), the baseline without deltas.

Generation is slowed on purpose (``--latency``, asleep: no core held) and the trainer too
(``--micro 16``: one sequence per forward/backward, ``--batch`` 256 groups), so that a trainer
step lasts seconds: in the reference a step is ~80-140 s and the 300 ms round trip is noise
next to it; with the tiny model's own pace (~0.35 s a step) the round trip alone is a step.

The link is scaled to the model: the reference moves a 28 GB full snapshot over 4 Gbit/s in
~56 s against trainer steps of ~80-140 s, so a full takes ~half a step. Here the bandwidth is
``full blob bytes / (--full-frac x seconds per trainer step)``, both measured in the ``local``
arm; the round trip stays ``--rtt-ms``.

Reported per arm (over the trainer steps after the first ``--skip-s`` seconds: start-up):
trainer steps, s/step, trainer wait ratio (sum of wait / sum of wait + busy), the run's
accounting; per worker (from its heartbeats on ``metrics``): episodes, mean and max version
lag, seconds downloading ahead of the engine (``weights.fetch_s``), seconds the engine was
held to apply (``weights.apply_s``), bytes fetched.

**Part 2, egress.** The ``local`` arm's real manifests and blobs published again, version by
version, to 1, 4 and 8 remote syncers (threads), without and with a regional mirror
(:mod:`astraflow.weights.mirror`; workers fetch from it, the trainer's store is their
fallback). Reported: bytes the trainer's weight server sent per version (its ``bytes_sent``).
Bytes do not depend on the link's shape, so this part runs without Toxiproxy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from astraflow.core.launcher import cli
from astraflow.core.ports import free_port
from bench.elastic import exit_code
from bench.lib.arms import (
    ROOT,
    arm_config,
    astraflow_run,
    make_warm,
    read_yaml,
    set_args,
    warm_models,
    write_yaml,
)
from bench.lib.runlog import read_jsonl, read_summary

BASE = ROOT / "examples" / "quickstart.yaml"
#: librdkafka settings for the far workers' clients (docs/wan.md)
FAR_CLIENT = "linger.ms=50&max.partition.fetch.bytes=8388608"


# -- part 1 ---------------------------------------------------------------------------------

class Region:
    """The far region: a broker listener advertised at a Toxiproxy proxy, a weight server over
    the run's store behind a second proxy, and the far worker processes of one arm."""

    def __init__(self, tp: Any, wan_bind: int, kafka_proxy: Any) -> None:
        self.tp = tp
        self.wan_bind = wan_bind
        self.kafka_proxy = kafka_proxy
        self.server: Any = None
        self.weights_proxy: Any = None
        self.procs: list[subprocess.Popen[bytes]] = []

    def link(self, link: Any) -> None:
        self.kafka_proxy.apply(link)
        if self.weights_proxy is not None:
            self.weights_proxy.apply(link)

    def start_workers(self, run_dir: Path, workers: Sequence[tuple[float, str]], link: Any,
                      logs: Path, deadline: float, arm: str, far: bool) -> None:
        """Once the run has written config-rl.yaml: start one worker per (speed, latency), far
        (Kafka and the run's store, served over HTTP, through the proxies) or local (the
        broker's own listener, the store as a directory: like the run's own worker)."""
        from astraflow.weights.http import make_server

        cfg = run_dir / "config-rl.yaml"
        while not (cfg.exists() and (run_dir / "processes.json").exists()):
            if time.monotonic() > deadline:
                raise SystemExit(f"{run_dir}: the run wrote no config-rl.yaml in time")
            time.sleep(0.2)
        sets_far: list[str] = []
        if far:
            store = run_dir / "weights"
            store.mkdir(parents=True, exist_ok=True)
            self.server = make_server(store)
            threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                             daemon=True).start()
            if self.weights_proxy is not None:
                self.weights_proxy.delete()
            port = self.server.server_address[1]
            self.weights_proxy = self.tp.proxy(f"weights-far-{port}", f"127.0.0.1:{port}",
                                               link=link)
            sets_far = [f"bus.url=kafka://{self.kafka_proxy.listen}?{FAR_CLIENT}",
                        "rollout.session_timeout=30", "weights.fetch.type=http",
                        f"weights.fetch.url=http://{self.weights_proxy.listen}",
                        "weights.fallback=null"]
        where = "far" if far else "near"
        for i, (speed, latency) in enumerate(workers):
            sets = [*sets_far, f"rollout.engine.speed={speed}",
                    f"rollout.engine.latency={latency}"]
            cmd = cli("rollout", str(cfg), "--out", str(run_dir),
                      "--worker-id", f"rollout-{arm}-{where}{i}", *set_args(sets))
            fh = open(logs / f"{arm}-{where}{i}.log", "w")  # noqa: SIM115 - closed with it
            self.procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                               cwd=ROOT))

    def stop_workers(self) -> list[int | None]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(60))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        self.procs = []
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        return codes


def worker_stats(run_dir: Path) -> list[dict[str, Any]]:
    """Per rollout process, from its heartbeats on the run's metrics topic."""
    from astraflow.config import load_experiment
    from astraflow.core.records import Metric
    from astraflow.core.topics import topic_name
    from astraflow.run.accounting import read_topic
    from astraflow.run.resources import open_bus

    cfg = load_experiment(run_dir / "config-rl.yaml")
    bus = open_bus(cfg, run_dir, create_topics=False)
    beats: dict[str, list[Metric]] = defaultdict(list)
    try:
        for _p, _o, m in read_topic(bus, topic_name(cfg.run, "metrics"), Metric):
            if m.role == "rollout":
                beats[m.component].append(m)
    finally:
        bus.close()
    rows = []
    for comp, ms in sorted(beats.items()):
        last = ms[-1]
        lags = [m.gauges.get("weights.lag.default") for m in ms
                if "weights.lag.default" in m.gauges]
        rows.append({
            "worker": comp, "speed": last.gauges.get("engine.speed", 1.0),
            "episodes": last.counters.get("episodes", 0.0),
            "lag_mean": sum(lags) / len(lags) if lags else None,
            "lag_max": max(lags) if lags else None,
            "fetch_s": last.counters.get("weights.fetch_s.default", 0.0),
            "apply_s": last.counters.get("weights.apply_s.default", 0.0),
            "fetched_mb": last.counters.get("weights.fetched_bytes.default", 0.0) / 1e6})
    return rows


def trainer_row(run_dir: Path, skip_s: float) -> dict[str, Any]:
    """Steps, s/step and wait ratio over the trainer's steps after the first ``skip_s``
    seconds (far workers start after the run has written its config, then join the group
    across the link: the first seconds measure start-up, not the link)."""
    rows = read_jsonl(run_dir / "trainer-default.jsonl")
    starts = [r["time"] for r in rows if r.get("event") == "start"]
    if not starts:
        return {"error": "no trainer steps"}
    t0 = min(starts) + skip_s
    steps = [r for r in rows if "step" in r and "event" not in r and r["time"] >= t0]
    if len(steps) < 2:
        return {"error": f"fewer than 2 trainer steps after the first {skip_s} s"}
    wait = sum(r.get("wait_s", 0.0) for r in steps)
    busy = sum(r.get("busy_s", 0.0) for r in steps)
    seconds = steps[-1]["time"] - steps[0]["time"]
    return {"steps": len(steps), "s_per_step": seconds / (len(steps) - 1),
            "wait_ratio": wait / max(wait + busy, 1e-9)}


def full_blob_bytes(run_dir: Path) -> int:
    fulls = sorted((run_dir / "weights").rglob("*.full.*.afw"))
    if not fulls:
        raise SystemExit(f"{run_dir}/weights holds no full snapshot")
    return fulls[-1].stat().st_size


def run_arm(arm: str, base: dict[str, Any], warm: Mapping[str, Path], args: argparse.Namespace,
            bootstrap: str, region: Region, link: Any) -> dict[str, Any]:
    speeds = [float(s) for s in args.speeds.split(",")]
    # a worker at speed s: its requests wait latency/s (a slower accelerator generating the
    # same tokens), and its engine's own compute is slowed to s
    workers = [(s, f"{args.latency / s:.3f}") for s in speeds]
    far = arm != "local"
    sets = [*args.sets, f"data.max_staleness={args.staleness}", "launch.evaluate=false",
            f"run=remote-{arm}-{os.getpid()}", f"trainer.micro_batch_tokens={args.micro}",
            f"data.batch_size={args.batch}", f"rollout.max_concurrent_episodes={args.slots}",
            f"rollout.engine.max_batch_size={args.slots}",
            # the run's own worker is the first (local) one; the bench starts the others
            "launch.rollout_workers=1", f"rollout.engine.speed={workers[0][0]}",
            f"rollout.engine.latency={workers[0][1]}"]
    if arm == "remote-full":
        sets.append("weights.max_delta_fraction=1e-9")  # no delta is ever small enough
    data = arm_config(base, sets, warm, seconds=args.seconds, latency=None,
                      workflow="single_turn", latency_key="latency")
    run_dir = args.out / arm
    cfg = write_yaml(data, args.out / f"{arm}.yaml")
    code: list[int] = []
    runner = threading.Thread(target=lambda: code.append(astraflow_run(
        cfg, run_dir, args.out / f"{arm}.log", [f"bus.url=kafka://{bootstrap}"])))
    t0 = time.monotonic()
    runner.start()
    try:
        region.start_workers(run_dir, workers[1:], link, args.out, time.monotonic() + 600,
                             arm, far)
        runner.join()
    finally:
        far_codes = region.stop_workers()
    print(f"[{arm}] exit {code[0] if code else None} in {time.monotonic() - t0:.0f} s; the "
          f"bench's workers exited {far_codes}", flush=True)
    summary = read_summary(run_dir)
    acc = summary.get("accounting", {})
    row = {"arm": arm, **trainer_row(run_dir, args.skip_s), "unaccounted": acc.get("unaccounted"),
           "trained_twice": acc.get("trained_twice"), "workers": worker_stats(run_dir)}
    fulls = len(list((run_dir / "weights").rglob("*.full.*.afw")))
    deltas = len(list((run_dir / "weights").rglob("*.delta.*.afw")))
    row.update(fulls=fulls, deltas=deltas)
    return row


# -- part 2 ---------------------------------------------------------------------------------

def egress(run_dir: Path, workers: int, mirror: bool, versions: int, tmp: Path
           ) -> dict[str, Any]:
    """Publish ``versions`` of run_dir's manifests again (their blobs served from its store)
    to ``workers`` syncers, each caught up after every version; bytes the trainer's server
    sent per version."""
    from astraflow.config import load_experiment
    from astraflow.core.bus import connect, embedded_url
    from astraflow.core.records import WeightManifest
    from astraflow.core.stream import Output, send
    from astraflow.core.topics import record_key, topic_name
    from astraflow.run.accounting import read_topic
    from astraflow.run.resources import open_bus
    from astraflow.weights.http import HttpStore, make_server
    from astraflow.weights.mirror import Mirror, serve_mirror
    from astraflow.weights.syncer import Syncer
    from astraflow.weights.target import DictTarget

    cfg = load_experiment(run_dir / "config-rl.yaml")
    src = open_bus(cfg, run_dir, create_topics=False)
    try:
        manifests = [m for _p, _o, m in read_topic(src, topic_name(cfg.run, "weights",
                                                                    "default"), WeightManifest)]
    finally:
        src.close()
    first_full = next(i for i, m in enumerate(manifests) if m.kind == "full")
    manifests = manifests[first_full:]
    keep = sorted({m.version for m in manifests})[:versions]
    manifests = [m for m in manifests if m.version in keep]
    tmp.mkdir(parents=True, exist_ok=True)
    bus = connect(embedded_url(Path(tmp) / "bus.db"))
    topic = topic_name("egress", "weights", "default")
    bus.create_topics({topic: 1})
    producer = bus.producer()
    trainer = make_server(run_dir / "weights")
    servers = [trainer]
    threading.Thread(target=trainer.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    upstream = HttpStore(trainer.url)
    fetch, mir = upstream, None
    if mirror:
        mir = Mirror(bus, run="egress", policies=["default"], upstream=upstream,
                     root=tmp / "mirror")
        served = serve_mirror(mir, hold_s=10)
        servers.append(served)
        threading.Thread(target=served.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        fetch = HttpStore(served.url)
    syncers = [Syncer(bus, run="egress", policy="default", store=fetch,
                      fallback=upstream if mirror else None,
                      target=DictTarget({}),
                      cache_dir=tmp / f"cache{i}") for i in range(workers)]
    try:
        by_version: dict[int, list[WeightManifest]] = defaultdict(list)
        for m in manifests:
            by_version[m.version].append(m)
        for v in keep:
            for m in by_version[v]:
                send(producer, Output(topic, m, record_key("weights", m)))
            producer.flush()
            if mir is not None:
                mir.mirror_once(timeout=5)
            threads = [threading.Thread(target=s.sync_once, kwargs={"timeout": 5})
                       for s in syncers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        held = {s.version for s in syncers}
        return {"workers": workers, "mirror": mirror, "versions": len(keep),
                "trainer_mb_per_version": trainer.bytes_sent / len(keep) / 1e6,
                "worker_mb_per_version": sum(s.stats.fetched_bytes for s in syncers)
                / len(keep) / workers / 1e6,
                "fallbacks": sum(s.stats.fallbacks for s in syncers),
                "all_at_newest": held == {keep[-1]}}
    finally:
        for s in syncers:
            s.close()
        if mir is not None:
            mir.close()
        for srv in servers:
            srv.shutdown()
            srv.server_close()
        producer.close()
        bus.close()


# -- output ---------------------------------------------------------------------------------

def table(rows: Sequence[Mapping[str, Any]], eg: Sequence[Mapping[str, Any]],
          link: Mapping[str, Any]) -> str:
    out = [f"worker speeds {link['speeds']} (request latency {link['latency']} s / speed); "
           f"steps counted after the first {link['skip_s']} s", f"link: RTT {link['rtt_ms']} ms, {link['bandwidth'] / 1e6:.2f} MB/s (a full "
           f"snapshot of {link['full_bytes'] / 1e6:.2f} MB takes {link['full_frac']} of a "
           f"{link['s_per_step']:.2f} s trainer step)", "",
           "| arm | trainer steps | s/step | trainer wait | fulls / deltas | unaccounted | "
           "trained twice |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['arm']} | {r['error']} | | | | | |")
            continue
        out.append(f"| {r['arm']} | {r['steps']} | {r['s_per_step']:.2f} | "
                   f"{r['wait_ratio']:.3f} | {r['fulls']} / {r['deltas']} | "
                   f"{r['unaccounted']} | {r['trained_twice']} |")
    out += ["", "| arm | worker | speed | episodes | lag mean / max | fetch s | apply s | "
            "fetched MB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for w in r.get("workers", []):
            lag = ("-" if w["lag_mean"] is None
                   else f"{w['lag_mean']:.2f} / {w['lag_max']:.0f}")
            out.append(f"| {r['arm']} | {w['worker']} | {w['speed']:.1f} | "
                       f"{w['episodes']:.0f} | {lag} | {w['fetch_s']:.1f} | "
                       f"{w['apply_s']:.1f} | {w['fetched_mb']:.1f} |")
    if eg:
        out += ["", "| remote workers | mirror | trainer egress MB/version | per worker "
                "MB/version | fallbacks | all at newest |", "|---|---|---|---|---|---|"]
        for e in eg:
            out.append(f"| {e['workers']} | {'yes' if e['mirror'] else 'no'} | "
                       f"{e['trainer_mb_per_version']:.3f} | {e['worker_mb_per_version']:.3f} "
                       f"| {e['fallbacks']} | {e['all_at_newest']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.remote", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="local,remote,remote-full")
    ap.add_argument("--seconds", type=float, default=180.0, help="RL seconds per arm")
    ap.add_argument("--speeds", default="1.0,0.6,0.3",
                    help="engine speed of each worker; the first is local in the far arms")
    ap.add_argument("--latency", type=float, default=1.0,
                    help="seconds each generate request of a full-speed worker waits (a worker "
                         "at speed s waits latency/s): generation slow enough that a trainer "
                         "step lasts seconds and the round trip is small next to it")
    ap.add_argument("--slots", type=int, default=512, help="episode slots per worker")
    ap.add_argument("--batch", type=int, default=256, help="groups per training batch")
    ap.add_argument("--skip-s", type=float, default=30.0,
                    help="trainer steps of the first seconds are not counted (start-up)")
    ap.add_argument("--rtt-ms", type=float, default=300.0)
    ap.add_argument("--full-frac", type=float, default=0.5,
                    help="a full snapshot takes this fraction of a trainer step on the link")
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="bytes/s of the link (default: from --full-frac and the local arm)")
    ap.add_argument("--staleness", type=int, default=2, help="data.max_staleness")
    ap.add_argument("--micro", type=int, default=16,
                    help="trainer.micro_batch_tokens (16: one sequence per forward/backward, "
                         "a slow trainer: the rollout pool can outrun it when all-local)")
    ap.add_argument("--egress-workers", default="1,4,8")
    ap.add_argument("--egress-versions", type=int, default=30)
    ap.add_argument("--warm", type=Path, default=None,
                    help="a finished quickstart run whose warm model to reuse")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-remote")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="config override for every arm (and the warm-up)")
    args = ap.parse_args()
    # every role and worker logs at INFO (consumer assignments, revocations): a worker that
    # takes no tasks shows why in its log
    os.environ.setdefault("ASTRAFLOW_LOG_LEVEL", "INFO")

    from astraflow.core.broker import LocalBroker
    from astraflow.core.broker.jars import fetch_jars
    from bench.lib.wan import INSTALL_HINT, Link, Toxiproxy, find_toxiproxy

    if find_toxiproxy() is None:
        raise SystemExit(f"bench/remote.py needs Toxiproxy: {INSTALL_HINT}")
    args.out.mkdir(parents=True, exist_ok=True)
    base = read_yaml(BASE)
    warm = warm_models(args.warm or make_warm(base, args.sets, args.out))
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if arms[0] != "local" and args.bandwidth is None:
        raise SystemExit("the first arm must be `local` (it sizes the link), or give "
                         "--bandwidth")
    fetch_jars()
    rows: list[dict[str, Any]] = []
    eg: list[dict[str, Any]] = []
    link_info: dict[str, Any] = {"rtt_ms": args.rtt_ms, "full_frac": args.full_frac,
                                 "speeds": args.speeds, "latency": args.latency,
                                 "skip_s": args.skip_s,
                                 "bandwidth": args.bandwidth or 0.0, "full_bytes": 0,
                                 "s_per_step": 0.0}
    with Toxiproxy() as tp:
        wan_bind, kafka_far = free_port(), free_port()
        kafka_proxy = tp.proxy("kafka-far", f"127.0.0.1:{wan_bind}",
                               listen=f"127.0.0.1:{kafka_far}")
        broker = LocalBroker(args.out / "kafka",
                             extra_listeners={"WAN": (wan_bind, f"127.0.0.1:{kafka_far}")})
        broker.start(timeout=120)
        region = Region(tp, wan_bind, kafka_proxy)
        try:
            link = Link(rtt_ms=args.rtt_ms, bandwidth_bytes_per_s=args.bandwidth)
            for arm in arms:
                if arm != "local" and not link_info["bandwidth"]:
                    raise SystemExit("no bandwidth: the local arm failed")
                link = Link(rtt_ms=args.rtt_ms,
                            bandwidth_bytes_per_s=link_info["bandwidth"] or None)
                region.link(link)
                row = run_arm(arm, base, warm, args, broker.bootstrap, region, link)
                rows.append(row)
                if arm == "local" and "error" not in row:
                    link_info["full_bytes"] = full_blob_bytes(args.out / "local")
                    link_info["s_per_step"] = row["s_per_step"]
                    if args.bandwidth is None:
                        link_info["bandwidth"] = link_info["full_bytes"] / (
                            args.full_frac * row["s_per_step"])
                print(json.dumps({k: v for k, v in row.items() if k != "workers"}),
                      flush=True)
            if "local" in arms and (args.out / "local" / "config-rl.yaml").exists():
                for n in [int(x) for x in args.egress_workers.split(",") if x]:
                    for mirror in (False, True):
                        e = egress(args.out / "local", n, mirror, args.egress_versions,
                                   args.out / f"egress-{n}-{int(mirror)}")
                        print(json.dumps(e), flush=True)
                        eg.append(e)
        finally:
            region.stop_workers()
            broker.stop()
    print(table(rows, eg, link_info))
    (args.out / "results.json").write_text(json.dumps({"link": link_info, "arms": rows,
                                                       "egress": eg}, indent=1))
    return exit_code(rows)


if __name__ == "__main__":
    raise SystemExit(main())
