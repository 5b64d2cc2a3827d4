"""metrics.jsonl, plots and the live view from real Metric records on an embedded bus."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from astraflow.core.bus import connect
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.topics import run_topics
from astraflow.run.collector import Collector
from astraflow.run.plots import plot_run, summary
from astraflow.run.view import render


def test_collector_writes_metrics_jsonl_plots_and_view(tmp_path: Path) -> None:
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    trainer = MetricsEmitter(bus, run="r", role="trainer", component="trainer-0")
    evaluator = MetricsEmitter(bus, run="r", role="evaluator", component="eval-0")
    rollout = MetricsEmitter(bus, run="r", role="rollout", component="rollout-0")
    col = Collector(bus, "r", jsonl=tmp_path / "metrics.jsonl")
    for step in range(1, 6):
        trainer.set("step", step)
        trainer.set("reward_mean", step / 10)
        trainer.set("wait_ratio", 0.5)
        trainer.emit()
        trainer.emit()  # the same step twice: one line only
        rollout.inc("episodes", 8)
        rollout.emit()
        if step % 2 == 0:
            evaluator.set("eval_step", step)
            evaluator.set("eval_accuracy", step / 20)
            evaluator.emit()
        col.poll(1.0)
        col.write_summary()
    col.poll(1.0)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["source"] == "trainer-0"]
    evals = [x for x in lines if "eval_accuracy" in x]
    assert [x["step"] for x in train] == [1, 2, 3, 4, 5]
    assert [(x["step"], x["eval_accuracy"]) for x in evals] == [(2, 0.1), (4, 0.2)]
    assert all({"time", "step", "elapsed"} <= set(x) for x in lines)
    assert any("episodes_per_s" in x for x in lines)
    s = summary(tmp_path / "metrics.jsonl")
    assert (s["trainer_steps"], s["eval_first"], s["eval_last"], s["eval_best"]) == (5, 0.1, 0.2, 0.2)
    pngs = plot_run(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert {p.name for p in pngs} == {"reward_accuracy_vs_step.png",
                                      "reward_accuracy_vs_elapsed.png", "throughput.png",
                                      "wait_ratio.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    console = Console(record=True, width=140)
    console.print(render(col, lags={"tasks→rollout": 3}, title="r"))
    text = console.export_text()
    assert "trainer-0" in text and "eval-0" in text and "held-out acc 0.200" in text
    assert "tasks→rollout 3" in text
    col.close()
    bus.close()


def test_collectors_each_see_every_snapshot_and_join_no_group(tmp_path: Path) -> None:
    import sqlite3

    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    emitters = [MetricsEmitter(bus, run="r", role="rollout", component=f"rollout-{i}")
                for i in range(4)]  # keyed by component: spread over the topic's partitions
    for e in emitters:
        e.emit()
    first, second = Collector(bus, "r"), Collector(bus, "r")
    for col in (first, second):  # a group would split the partitions between the two
        for _ in range(20):
            if len(col.components) == 4:
                break
            col.poll(0.5)
        assert set(col.components) == {f"rollout-{i}" for i in range(4)}
    first.close()
    second.close()
    conn = sqlite3.connect(tmp_path / "bus.db")
    for table in ("group_members", "group_owners", "group_offsets", "group_state"):
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
    conn.close()
    bus.close()


def test_a_run_without_steps_plots_without_warnings(tmp_path: Path) -> None:
    """A run stopped before its first trainer step (a warm-up only) still gets its four plots,
    with no legend over nothing (matplotlib warns about one)."""
    import warnings

    (tmp_path / "metrics.jsonl").write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pngs = plot_run(tmp_path / "metrics.jsonl", tmp_path / "plots")
    assert len(pngs) == 4
