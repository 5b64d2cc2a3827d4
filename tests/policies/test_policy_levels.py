"""A stage's policy counts reach the metrics emitter as counters and its levels (queue
lengths, probabilities) as gauges."""

from __future__ import annotations

from pathlib import Path

from policy_helpers import task

from astraflow.core.bus import connect
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.records import Task
from astraflow.core.topics import run_topics
from astraflow.policies.chain import Chain
from astraflow.policies.gate import Gate
from astraflow.policies.runner import StageRunner, StageTopics


def gate_chain() -> Chain:
    return Chain("pre_rollout", [("gate", Gate(batch_size=1, max_staleness=0))])


def test_chain_names_the_gate_levels() -> None:
    chain = gate_chain()
    assert chain.levels() == {"gate.waiting", "gate.in_flight", "gate.started"}
    chain.run([task("a"), task("b"), task("c")])
    counters = chain.counters()
    assert counters["gate.held"] == 2 and counters["gate.waiting"] == 2


def test_runner_reports_counts_as_counters_and_levels_as_gauges(tmp_path: Path) -> None:
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    metrics = MetricsEmitter(bus, run="r", role="policy", component="policy-pre_rollout")
    chain = gate_chain()
    chain.run([task("a"), task("b"), task("c")])
    runner = StageRunner(bus, chain, StageTopics(main=[], main_kind=Task, side=[], dlq="",
                                                 run="r"),
                         stage="pre_rollout", policy=None, checkpoint=tmp_path / "ck",
                         group="g", metrics=metrics)
    runner.stats.update({"in": 3, "checkpoint_bytes": 123})
    runner._report(force=True)
    counters, gauges = metrics.snapshot()
    assert counters["runner.in"] == 3 and counters["gate.held"] == 2
    assert gauges["gate.waiting"] == 2 and gauges["runner.checkpoint_bytes"] == 123
    assert not {"gate.waiting", "gate.in_flight", "runner.checkpoint_bytes"} & set(counters)
    metrics.close()
    bus.close()
