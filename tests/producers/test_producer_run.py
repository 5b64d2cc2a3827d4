"""Producing tasks to the bus: n samples, one group per (task, attempt), idempotent re-runs,
and the `astraflow produce` command function."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ExperimentConfig
from astraflow.core.records import Task, decode
from astraflow.core.topics import topic_name
from astraflow.producers.producer import produce_tasks, tasks
from astraflow.run.resources import open_bus
from astraflow.run.roles import run_configured_producer


def config(tmp_path: Path, **producer: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({
        "run": f"p{uuid.uuid4().hex[:8]}", "bus": {"url": f"embedded://{tmp_path}/bus.db"},
        "producer": producer})


def read_tasks(bus, topic: str) -> list[Task]:  # noqa: ANN001
    c = bus.consumer(f"read-{uuid.uuid4().hex[:6]}", [topic], start="earliest")
    out: list[Task] = []
    try:
        while batch := c.consume(1000, 0.5):
            out.extend(decode(m.value, Task) for m in batch)  # type: ignore[misc]
    finally:
        c.close()
    return out


def test_tasks_carry_samples_workflow_and_group_ids(tmp_path: Path) -> None:
    cfg = config(tmp_path, n_samples=4, workflow="multi_turn_tools", epochs=2,
                 system_prompt="be brief", arithmetic={"count": 5})
    got = list(tasks(cfg.producer))
    assert len(got) == 10
    first, second = got[:5], got[5:]
    assert [t.id for t in first] == [t.id for t in second]
    assert all(t.attempt == 0 and t.group_id == f"{t.id}#0" for t in first)
    assert all(t.attempt == 1 and t.group_id == f"{t.id}#1" for t in second)
    assert all(t.n_samples == 4 and t.workflow == "multi_turn_tools" for t in got)
    assert [m.role for m in got[0].prompt] == ["system", "user"]
    assert got[0].dataset == "arith" and got[0].metadata == {"split": "train"}


def test_produce_is_idempotent_and_keyed_by_task_id(tmp_path: Path) -> None:
    cfg = config(tmp_path, topic="tasks", arithmetic={"count": 30})
    bus = open_bus(cfg, tmp_path)
    try:
        first = produce_tasks(bus, cfg.producer, run=cfg.run)
        again = produce_tasks(bus, cfg.producer, run=cfg.run)
        more = produce_tasks(bus, cfg.producer.model_copy(
            update={"arithmetic": cfg.producer.arithmetic.model_copy(update={"count": 40})}),
            run=cfg.run)
        assert (first.produced, again.produced, again.skipped) == (30, 0, 30)
        assert (more.produced, more.skipped) == (10, 30)
        topic = topic_name(cfg.run, "tasks")
        got = read_tasks(bus, topic)
        assert len(got) == 40 and len({t.group_id for t in got}) == 40
        # records are keyed by task id: the same id always lands on the same partition
        c = bus.consumer(f"k-{uuid.uuid4().hex[:6]}", [topic], start="earliest")
        msgs = c.consume(1000, 1.0)
        c.close()
        assert all(m.key == decode(m.value, Task).id.encode() for m in msgs)
        assert read_tasks(bus, topic_name(cfg.run, "tasks.raw")) == []
    finally:
        bus.close()


def test_max_tasks_and_jsonl_source(tmp_path: Path) -> None:
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                            for i in range(10)))
    cfg = config(tmp_path, source="jsonl", path=["{out}/qa.jsonl"], max_tasks=4)
    stats = run_configured_producer(cfg, tmp_path)
    assert stats.produced == 4
    bus = open_bus(cfg, tmp_path)
    try:
        got = read_tasks(bus, topic_name(cfg.run, "tasks.raw"))
        assert sorted(t.id for t in got) == [f"qa:{i}" for i in range(4)]
        assert got[0].dataset == "qa"
    finally:
        bus.close()


def test_jsonl_without_path_is_a_clear_error(tmp_path: Path) -> None:
    from astraflow.producers.sources import SourceError

    cfg = config(tmp_path, source="jsonl")
    with pytest.raises(SourceError, match="needs producer.path"):
        list(tasks(cfg.producer))


def test_produce_command_function(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  new_run: Any) -> None:
    from astraflow.cli.produce import produce as produce_cmd

    run = f"c{uuid.uuid4().hex[:6]}"
    path = tmp_path / "exp.yaml"
    path.write_text(f"run: {run}\nbus: {{url: 'embedded://{{out}}/bus.db'}}\n"
                    "producer: {arithmetic: {count: 7}, n_samples: 2}\n")
    new_run(path, tmp_path)  # a role joins a run: its bus exists
    produce_cmd(config=path, out=tmp_path, overrides=["producer.topic=tasks"], max_tasks=None)
    assert "produced=7 skipped=0 topic=tasks" in capsys.readouterr().out
    produce_cmd(config=path, out=tmp_path, overrides=["producer.topic=tasks"], max_tasks=None)
    assert "produced=0 skipped=7" in capsys.readouterr().out


def test_producer_counters_show_while_it_produces(tmp_path: Path) -> None:
    """A slow producer reports tasks_produced while it runs, not only when it finishes."""
    from astraflow.core.records import Metric

    cfg = config(tmp_path, arithmetic={"count": 6}, rate_limit=2.0)  # 3 s of producing
    run_configured_producer(cfg, tmp_path)
    bus = open_bus(cfg, tmp_path)
    c = bus.consumer(f"read-{uuid.uuid4().hex[:6]}", [topic_name(cfg.run, "metrics")])
    metrics = [decode(m.value, Metric) for m in c.consume(100, 2.0)]
    c.close()
    bus.close()
    running = [m for m in metrics if m.status == "running"]
    assert running and running[0].counters.get("tasks_produced", 0) >= 1
    # sent early, while tasks were still coming (counted, not timed: the first report goes
    # out after the first task)
    assert running[0].counters["tasks_produced"] < 6 and running[0].ts <= metrics[-1].ts
    assert metrics[-1].status == "stopped" and metrics[-1].counters["tasks_produced"] == 6



def test_the_producer_keeps_a_bounded_lead_over_its_reader(tmp_path: Path) -> None:
    """``producer.max_lead``: 20 epochs of 50 tasks with a lead of 100 and flushes of 25: the
    producer stops writing once its reader has 100 or more tasks left to take (here 100: it
    checks at each flush), writes on as the reader commits, and a stop ends its wait."""
    import threading

    cfg = config(tmp_path, topic="tasks", epochs=20, max_lead=100, flush_every=25,
                 arithmetic={"count": 50})
    topic = topic_name(cfg.run, "tasks")
    group = cfg.rollout.group_for(cfg.run)
    bus = open_bus(cfg, tmp_path)
    stop = threading.Event()
    got: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: got.update(stats=produce_tasks(
        bus, cfg.producer, run=cfg.run, reader=group, should_stop=stop.is_set)))
    worker.start()
    try:
        reader = bus.consumer(group, [topic], start="earliest")
        seen = 0
        try:
            deadline = time.monotonic() + 30
            while sum(bus.describe_topic(topic).end_offsets.values()) < 100:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)  # it would have written more by now if it did not wait
            assert sum(bus.describe_topic(topic).end_offsets.values()) == 100
            # the reader takes 60 and commits: the producer writes on to a lead of 100 again
            while seen < 60:
                batch = reader.consume(60 - seen, 1.0)
                seen += len(batch)
            reader.commit()
            deadline = time.monotonic() + 30
            while sum(bus.describe_topic(topic).end_offsets.values()) < 175:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)
            assert sum(bus.describe_topic(topic).end_offsets.values()) == 175
        finally:
            reader.close()
        stop.set()
        worker.join(30)
        assert not worker.is_alive()
        stats = got["stats"]
        assert stats.produced == 175 and stats.waited_s > 0.5, stats
    finally:
        stop.set()
        worker.join(30)
        bus.close()


def test_the_run_role_waits_for_the_pre_rollout_stage(tmp_path: Path) -> None:
    """`astraflow produce` on ``tasks.raw`` leads the pre-rollout stage's group by at most
    ``producer.max_lead``; with ``max_lead: null`` it writes every epoch at once."""
    cfg = config(tmp_path, epochs=4, max_lead=50, flush_every=10, arithmetic={"count": 40})
    until = time.monotonic() + 1.0  # nobody reads: it writes 50 and waits until stopped
    stats = run_configured_producer(cfg, tmp_path, should_stop=lambda: time.monotonic() > until)
    assert stats.produced == 50 and stats.waited_s > 0.5, stats
    unbounded = config(tmp_path / "b", epochs=4, max_lead=None, arithmetic={"count": 40})
    (tmp_path / "b").mkdir()
    assert run_configured_producer(unbounded, tmp_path / "b").produced == 160
