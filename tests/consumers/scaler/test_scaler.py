"""The scaler on a real bus (each backend): reports in, the command actuator out (a real shell
script that records its calls), bad reports to the DLQ, failing commands retried and reported
without stopping the scaler."""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from astraflow.consumers.scaler.command import CommandActuator
from astraflow.consumers.scaler.config import PoolConfig, ScaleConfig
from astraflow.consumers.scaler.scaler import Scaler, scaler_processor
from astraflow.core.bus import Bus, connect
from astraflow.core.records import DeadLetter, LoadReport, Metric, decode, encode
from astraflow.core.topics import run_topics, topic_name

RECORDER = """#!/bin/sh
# records its call; fails while the file fail-left holds a positive number
echo "$@" >> "{calls}"
left=$(cat "{fail}" 2>/dev/null || echo 0)
if [ "$left" -gt 0 ]; then echo $((left - 1)) > "{fail}"; echo "quota exceeded" >&2; exit 3; fi
"""


@pytest.fixture
def bus(bus_url: str) -> Iterator[Bus]:
    b = connect(bus_url)
    yield b
    b.close()


def script(tmp_path: Path, fails: int = 0) -> tuple[Path, Path]:
    calls, fail = tmp_path / "calls.txt", tmp_path / "fail-left"
    fail.write_text(str(fails))
    path = tmp_path / "scale.sh"
    path.write_text(RECORDER.format(calls=calls, fail=fail))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path, calls


def report(seq: int, w: float, workers: int, produced: int = 100,
           consumed: int = 100) -> LoadReport:
    return LoadReport(run="r", seq=seq, window_start=0.0, window_end=1.0, trainer_step=seq,
                      wait_ratio=w, produced=produced, consumed=consumed,
                      current_workers=workers)


def produce(bus: Bus, topic: str, values: list[bytes]) -> None:
    p = bus.producer()
    for v in values:
        p.produce(topic, v, key=b"r")
    p.flush()
    p.close()


def scale_config(**kw: object) -> ScaleConfig:
    return ScaleConfig(confirm=1, cooldown_s=0.0, max_step_down=None, pools={
        "rollout": PoolConfig(min_workers=1, max_workers=6, actuator={  # type: ignore[arg-type]
            "type": "command", "command": "unused"})}, **kw)


def run_scaler(bus: Bus, run: str, actuator: CommandActuator, tmp_path: Path,
               n: int) -> Scaler:
    scaler = Scaler(scale_config(), {"rollout": actuator}, log_path=tmp_path / "scaler.jsonl",
                    clock=iter(range(1000)).__next__)
    proc = scaler_processor(bus, scaler, run=run, poll_timeout=0.2)
    try:
        proc.run(n, 60.0)
    finally:
        proc.close()
        scaler.close()
    return scaler


def test_the_command_actuator_is_called_with_the_decided_counts(bus: Bus,
                                                                tmp_path: Path) -> None:
    run = f"sc-{uuid.uuid4().hex[:8]}"
    bus.create_topics(run_topics(run, ["default"]))
    path, calls = script(tmp_path)
    act = CommandActuator(f"{path} --pool {{pool}} --run {{run}} --from {{current}} "
                          "--replicas {target}", run=run, pool="rollout", retries=0)
    produce(bus, topic_name(run, "reports"), [encode(r) for r in (
        report(0, 0.5, 2),                            # starved: ceil(2 / 0.5) = 4
        report(1, 0.07, 4),                           # balanced: hold, no call
        report(2, 0.0, 4, produced=100, consumed=40),  # idle: ceil(4 * 0.4 * 1.1) = 2
        report(3, 0.99, 2),                           # starved: 40, bounded at 6
    )])
    scaler = run_scaler(bus, run, act, tmp_path, 4)
    assert calls.read_text().splitlines() == [
        f"--pool rollout --run {run} --from 2 --replicas 4",
        f"--pool rollout --run {run} --from 4 --replicas 2",
        f"--pool rollout --run {run} --from 2 --replicas 6"]
    lines = [json.loads(x) for x in (tmp_path / "scaler.jsonl").read_text().splitlines()]
    assert [(x["report_seq"], x["zone"], x["action"]) for x in lines] == [
        (0, "starved", "up"), (1, "balanced", "hold"), (2, "idle", "down"), (3, "starved", "up")]
    assert all(x["actuation"]["ok"] for x in lines if x["action"] != "hold")
    assert lines[0]["inputs"]["w"] == 0.5
    assert len(scaler.decisions) == 4


def test_bad_reports_go_to_the_dlq_and_failing_commands_are_retried_and_reported(
        bus: Bus, tmp_path: Path) -> None:
    run = f"sc-{uuid.uuid4().hex[:8]}"
    bus.create_topics(run_topics(run, ["default"]))
    path, calls = script(tmp_path, fails=5)  # the first 5 calls fail
    slept: list[float] = []
    act = CommandActuator(f"{path} {{target}}", run=run, pool="rollout", retries=2,
                          backoff_s=0.5, sleep=slept.append)
    metric = Metric(component="x", role="rollout", host="h", pid=1)
    produce(bus, topic_name(run, "reports"), [
        b"\xc1 not msgpack",
        encode(report(0, 0.5, 2)),   # 3 attempts, all fail: reported, the scaler goes on
        encode(metric),              # a record of another type
        encode(report(1, 0.5, 2)),   # fails twice more, then succeeds on its 3rd attempt
    ])
    scaler = run_scaler(bus, run, act, tmp_path, 4)
    assert calls.read_text().splitlines() == ["4"] * 6
    assert slept == [0.5, 1.0, 0.5, 1.0]  # backoff doubles, per call
    failed, done = [d for d in scaler.decisions if d["action"] == "up"]
    assert failed["actuation"]["ok"] is False and failed["actuation"]["attempts"] == 3
    assert "quota exceeded" in failed["actuation"]["error"]
    assert done["actuation"]["ok"] is True and done["actuation"]["attempts"] == 3
    reader = bus.reader(topic_name(run, "dlq"))
    letters = [decode(m.value, DeadLetter) for m in reader.consume(10, 5.0)]
    reader.close()
    assert len(letters) == 2
    assert all(isinstance(x, DeadLetter) and x.topic == topic_name(run, "reports")
               for x in letters)
    assert {x.offset for x in letters} == {0, 2}  # type: ignore[union-attr]
