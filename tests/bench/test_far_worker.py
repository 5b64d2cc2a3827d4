"""A rollout worker behind a far link keeps producing trajectories with every version the
trainer publishes, and the weights it generates with stay within the staleness bound of the
newest published version.

A real ``astraflow rollout`` process reaches the session's Kafka broker and the trainer's
weight server only through Toxiproxy proxies with a 300 ms round trip (and a bandwidth cap on
the weights); the test plays the trainer and the gate on the direct listener: it publishes
versions one after another (sparse changes of the tiny model, as an optimizer step makes:
deltas, a full every 5), each once the worker has generated with the one before (counted, not
timed: how far behind a far worker falls at a given publishing rate depends on the machine,
and is measured by bench/remote.py, its version-lag columns), and releases tasks all along;
it reads the worker's trajectories back.
"""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from astraflow.config import load_experiment
from astraflow.core.records import ChatMessage, Task, Trajectory, decode
from astraflow.core.stream import Output, send
from astraflow.core.topics import topic_name
from astraflow.models.tiny import build_model, build_tokenizer, save
from astraflow.run.resources import open_bus
from astraflow.weights.http import make_server
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore
from bench.lib.wan import Link, Toxiproxy

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = 8  # published after version 0
WAIT_S = 120.0  # a hang guard: the worker generates with a version published this long ago
BOUND = 2  # the staleness bound the trajectories must keep (data.max_staleness)


def config(tmp: Path, run: str, model: Path, bus: str, weights_url: str | None) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data.update(run=run, bus={"url": bus})
    data["models"] = {"default": {"path": str(model), "build": "none"}}
    data["rollout"].update(max_concurrent_episodes=64, session_timeout=30.0,
                           weights={"enabled": True, "poll_interval": 0.2})
    if weights_url is not None:
        data["weights"]["fetch"] = {"type": "http", "url": weights_url}
    path = tmp / f"{'far' if weights_url else 'home'}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_a_far_worker_keeps_producing_within_the_staleness_bound(
        tmp_path: Path, wan_kafka: tuple, toxiproxy: Toxiproxy) -> None:
    broker, kafka_far = wan_kafka
    tok = build_tokenizer("arith")
    trainer_model = build_model(tok, seed=0)
    model_dir = save(trainer_model, tok, tmp_path / "model")
    store = FileStore(tmp_path / "weights")
    store.root.mkdir()
    server = make_server(store.root)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    link = Link(rtt_ms=300, bandwidth_bytes_per_s=4_000_000)
    weights_far = toxiproxy.proxy("weights-far", f"127.0.0.1:{server.server_address[1]}",
                                  link=link)
    run = f"far{uuid.uuid4().hex[:8]}"
    home = load_experiment(config(tmp_path, run, model_dir, f"kafka://{broker.bootstrap}",
                                  None))
    far_cfg = config(tmp_path, run, model_dir,
                     f"kafka://{kafka_far}?linger.ms=50&max.partition.fetch.bytes=8388608",
                     f"http://{weights_far.listen}")
    bus = open_bus(home, tmp_path)  # the trainer's side: the direct listener, topics created
    producer = bus.producer()
    pub = Publisher(bus, run=run, policy="default", store=store, full_every=5)
    published: list[tuple[float, int]] = []  # (time, version), as the manifests went out
    pub.publish(trainer_model.state_dict(), 0)
    pub.flush()
    published.append((time.time(), 0))
    worker = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli.app", "rollout", str(far_cfg), "--out",
         str(tmp_path), "--worker-id", "rollout-far-test"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = bus.reader(topic_name(run, "trajectories"), client_id="test-far")
    got: list[Trajectory] = []

    def release(n: int, start: int) -> None:
        for i in range(start, start + n):
            task = Task(id=f"t{i}", dataset="far", prompt=[ChatMessage(role="user",
                        content=f"{i % 90}+{i % 7}=")], reference={"answer": str(i % 90 + i % 7)},
                        n_samples=4)
            send(producer, Output(topic_name(run, "tasks"), task, task.id.encode()))
        producer.flush()

    released = 0

    def generated_with(version: int) -> None:
        """Release tasks and read trajectories until one was generated with ``version``."""
        nonlocal released
        deadline = time.monotonic() + WAIT_S
        while True:
            assert worker.poll() is None, worker.stdout.read()  # type: ignore[union-attr]
            release(8, released)
            released += 8
            batch = [decode(m.value, Trajectory) for m in reader.consume(500, 0.5)]
            got.extend(batch)
            if any(t.version_vector["default"] >= version for t in batch):
                return
            assert time.monotonic() < deadline, (
                f"no trajectory with version {version} within {WAIT_S:.0f} s (a hang guard)")

    try:
        generated_with(0)  # the worker is up and reached the broker across the link
        gen = torch.Generator().manual_seed(0)
        for v in range(1, VERSIONS + 1):
            with torch.no_grad():  # an optimizer-like step: a few values move
                for p in trainer_model.parameters():
                    mask = torch.rand(p.shape, generator=gen) < 0.02
                    p.add_(mask * torch.randn(p.shape, generator=gen) * 1e-2)
            pub.publish(trainer_model.state_dict(), v)
            pub.flush()
            published.append((time.time(), v))
            generated_with(v)  # across the link: the manifest, the delta or full, applied
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=60)[0]
        reader.close()
        pub.close()
        producer.close()
        bus.close()
        server.shutdown()
        server.server_close()
        weights_far.delete()
    assert worker.returncode == 0, output[-3000:]
    assert {t.worker_id for t in got} == {"rollout-far-test"}
    # it kept producing: with every version, each reached across the link (none skipped:
    # the next went out only once the worker had generated with this one)
    assert {t.version_vector["default"] for t in got} == set(range(VERSIONS + 1))
    # and generated with weights at most BOUND versions behind the newest published when it
    # recorded them
    times = [t for t, _ in published]
    lags = []
    for t in got:
        newest = published[bisect.bisect_right(times, t.created_at) - 1][1] \
            if t.created_at >= times[0] else 0
        lags.append(newest - t.version_vector["default"])
    assert max(lags) <= BOUND, sorted(lags)[-10:]
    assert max(t.version_vector["default"] for t in got) == VERSIONS  # it caught up at the end
    assert os.path.exists(tmp_path / "weights-cache")  # downloads went through the cache
