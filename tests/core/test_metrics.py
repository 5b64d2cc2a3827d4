from __future__ import annotations

from pathlib import Path

from astraflow.core.bus import connect
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.records import Metric, decode
from astraflow.core.topics import run_topics, topic_name


def test_emitter_sends_heartbeats_with_counters_and_gauges(tmp_path: Path) -> None:
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    m = MetricsEmitter(bus, run="r", role="rollout", interval=3600)
    m.inc("episodes")
    m.inc("episodes", 2)
    m.set("inflight", 4)
    assert m.tick() is True  # first tick always emits
    assert m.tick() is False  # then at most once per interval
    m.close()
    c = bus.consumer("reader", [topic_name("r", "metrics")])
    recs = [decode(x.value, Metric) for x in c.consume(10, 2.0)]
    c.close()
    assert [r.status for r in recs] == ["running", "stopped"]
    age = recs[0].counters.pop("time.alive_s")  # the process's age: its wall time so far
    assert 0 < age <= recs[1].counters["time.alive_s"] < 24 * 3600
    assert recs[0].counters == {"episodes": 3.0} and recs[0].gauges == {"inflight": 4.0}
    assert recs[0].component.startswith("rollout-") and recs[0].role == "rollout"
    bus.close()


def test_prometheus_endpoint_exports_counters_and_gauges(tmp_path: Path) -> None:
    import urllib.request

    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    m = MetricsEmitter(bus, run="r", role="trainer", component="trainer-x")
    m.inc("steps", 3)
    m.set("wait ratio", 0.25)
    port = m.serve_prometheus(0)
    assert port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'astraflow_steps_total{component="trainer-x",role="trainer",run="r"} 3.0' in text
    assert 'astraflow_wait_ratio{component="trainer-x",role="trainer",run="r"} 0.25' in text
    assert f'astraflow_prometheus_port{{component="trainer-x",role="trainer",run="r"}} {float(port)}' in text
    m.close()
    bus.close()
