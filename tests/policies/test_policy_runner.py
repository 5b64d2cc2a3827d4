"""Stage processors on the embedded bus: outputs, exact resume, dead letters, SIGKILL."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from policy_helpers import end_count, group_trajs, produce, read_all, tgroup, traj
from waiting import wait_for

from astraflow.config import ExperimentConfig
from astraflow.core.errors import ConfigError
from astraflow.core.records import Batch, DeadLetter, GroupStats, TrajectoryGroup
from astraflow.core.topics import topic_name
from astraflow.policies.base import PolicyError
from astraflow.policies.runner import StageRunner
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_checkpoint_path, run_configured_stage

POST = {"post_rollout": ["assembler", "staleness", "dynamic_sampling"],
        "assembler": {"group_size": 4}, "commit_interval_s": 0.001, "poll_records": 8}


def trajectories(n_groups: int, start: int = 0) -> list:
    """Groups of 4: mixed, easy, hard, one failed episode, and a redelivered duplicate."""
    out = []
    for g in range(start, start + n_groups):
        gid = f"t{g}#0"
        kind = g % 4
        rewards = [[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 1]][kind]
        ts = group_trajs(gid, rewards)
        if kind == 3:
            ts[3] = traj(gid, 3, 0.0, finish="error")
            ts.insert(1, ts[0])
        out.extend(ts)
    return out


def outputs(bus, run: str) -> tuple[list[str], list[str]]:
    groups = read_all(bus, topic_name(run, "groups", "default"))
    stats = read_all(bus, topic_name(run, "stats"))
    assert all(isinstance(g, TrajectoryGroup) for g in groups)
    assert all(isinstance(s, GroupStats) for s in stats)
    return [g.group_id for g in groups], [s.group_id for s in stats]


def policy_counters(c: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in c.items() if not k.startswith("runner.")}


def test_post_stage_end_to_end_and_exact_resume(bus_url: str, tmp_path: Path,
                                                make_config: Callable[..., ExperimentConfig],
                                                caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(POST, url=bus_url)
    bus = open_bus(cfg, tmp_path)
    records = trajectories(40)
    produce(bus, cfg.run, "trajectories", records)
    with monkeypatch.context() as m:  # commits lost: the checkpoint alone says where to resume
        m.setattr(StageRunner, "_commit", lambda self, consumers: None)
        first = run_configured_stage(cfg, "post_rollout", bus=bus, max_records=70)
    assert first["runner.in"] == 70
    with caplog.at_level(logging.WARNING, logger="astraflow.policies"):
        rest = run_configured_stage(cfg, "post_rollout", bus=bus, max_records=len(records) - 70,
                         timeout=30)
    assert rest["runner.in"] == len(records) - 70 and "runner.recovered_out" not in rest
    assert "runner.skipped_done" not in rest  # the consumer sought the checkpoint's offsets
    assert not [r for r in caplog.records if "seek" in r.getMessage()]
    groups, stats = outputs(bus, cfg.run)
    assert sorted(groups) == sorted(f"t{g}#0" for g in range(40) if g % 4 in (0, 3))
    assert len(stats) == 40 == len(set(stats))  # one GroupStats per group, no duplicates
    assert policy_counters(rest) == {
        "assembler.trajectories": 160, "assembler.duplicate": 10, "assembler.failed": 10,
        "assembler.groups": 40, "assembler.groups_partial": 10, "assembler.open": 0,
        "staleness.kept": 40, "dynamic_sampling.generated": 40, "dynamic_sampling.kept": 20,
        "dynamic_sampling.dropped_easy": 10, "dynamic_sampling.dropped_hard": 10}
    bus.close()


def test_undecodable_and_failing_records_go_to_the_dead_letter_topic(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    cfg = make_config(POST)
    bus = open_bus(cfg, tmp_path)
    p = bus.producer()
    p.produce(topic_name(cfg.run, "trajectories"), b"\x93not a record", key=b"x")
    p.flush()
    produce(bus, cfg.run, "trajectories",
            [traj("z#0", 0, 1.0, policy="stranger")] + group_trajs("ok#0", [1, 0, 0, 1]))
    counters = run_configured_stage(cfg, "post_rollout", bus=bus, max_records=6, timeout=20)
    assert counters["runner.dead_lettered"] == 2
    dead = read_all(bus, topic_name(cfg.run, "dlq"))
    assert all(isinstance(d, DeadLetter) for d in dead)
    assert sorted(d.error_type for d in dead) == ["PolicyError", "SchemaError"]
    # keyed by the bad record's own key, like every role's letters (not the topic's name)
    assert sorted(d.key for d in dead) == [b"x", b"z#0"]
    c = bus.consumer("dlq-keys", [topic_name(cfg.run, "dlq")], session_timeout=5)
    msgs = []
    deadline = time.monotonic() + 30
    while len(msgs) < 2 and time.monotonic() < deadline:
        msgs.extend(c.consume(10, 0.5))
    c.close()
    assert sorted(m.key for m in msgs) == [b"x", b"z#0"]
    assert outputs(bus, cfg.run)[0] == ["ok#0"]
    bus.close()


def test_a_bad_record_close_to_the_size_limit_is_dead_lettered_by_a_stage(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    cfg = make_config(POST)
    bus = open_bus(cfg, tmp_path)
    p = bus.producer()
    poison = b"\x93" + b"\xff" * (bus.max_message_bytes - 1000)
    p.produce(topic_name(cfg.run, "trajectories"), poison, key=b"big")
    p.flush()
    produce(bus, cfg.run, "trajectories", group_trajs("ok#0", [1, 0, 0, 1]))
    counters = run_configured_stage(cfg, "post_rollout", bus=bus, max_records=5, timeout=20)
    assert counters["runner.dead_lettered"] == 1 and "runner.too_large" not in counters
    (dead,) = read_all(bus, topic_name(cfg.run, "dlq"))
    assert dead.key == b"big" and dead.value_size == len(poison)
    assert outputs(bus, cfg.run)[0] == ["ok#0"]
    bus.close()


def test_a_checkpoint_of_another_stage_is_refused(make_config, tmp_path: Path) -> None:
    cfg = make_config(POST)
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, "trajectories", group_trajs("a#0", [1, 0]))
    run_configured_stage(cfg, "post_rollout", bus=bus, max_records=2, timeout=20)
    path = configured_checkpoint_path(cfg, "post_rollout", None)
    other = cfg.model_copy(update={"run": "other"})
    path.rename(configured_checkpoint_path(other, "post_rollout", None))
    with pytest.raises(PolicyError, match="belongs to run="):
        run_configured_stage(other, "post_rollout", bus=bus, timeout=0.2)
    with pytest.raises(ConfigError, match="--policy is for the batch stage"):
        run_configured_stage(cfg, "post_rollout", policy="default", bus=bus, timeout=0.2)
    bus.close()


# ------------------------------------------------------------------------ SIGKILL

def write_config(cfg: ExperimentConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return path


def start(config: Path, stage: str, out: Path, fault: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "ASTRAFLOW_POLICY_FAULT": fault or ""}
    return subprocess.Popen([sys.executable, "-m", "astraflow.cli.policy", str(config), stage,
                             "--out", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, done: Callable[[], bool]) -> dict[str, float]:
    """Wait until ``done()``, stop ``proc`` with SIGTERM, return its printed counters."""
    wait_for(lambda: done() or proc.poll() is not None, 30, "the processor's outputs")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return {k: float(v) for k, v in (kv.split("=") for kv in out.split())}


@pytest.mark.parametrize("fault", ["after_checkpoint:3", "after_flush:3", "after_commit:3",
                                   "external"])
def test_sigkilled_post_stage_restarts_to_the_same_outputs(
        fault: str, make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    cfg = make_config(POST)
    bus = open_bus(cfg, tmp_path)
    records = trajectories(48)
    # the reference: an uninterrupted run of the same records in another run
    ref = make_config(POST, run=f"{cfg.run}ref")
    ref_bus = open_bus(ref, tmp_path)
    produce(ref_bus, ref.run, "trajectories", records)
    ref_counters = run_configured_stage(ref, "post_rollout", bus=ref_bus, max_records=len(records))
    want_groups, want_stats = outputs(ref_bus, ref.run)

    config = write_config(cfg, tmp_path / "post.yaml")
    groups_topic = topic_name(cfg.run, "groups", "default")
    if fault == "external":
        produce(bus, cfg.run, "trajectories", records[:60])
        proc = start(config, "post_rollout", tmp_path)
        wait_for(lambda: end_count(bus, groups_topic) > 0, 30, "first outputs")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        produce(bus, cfg.run, "trajectories", records[60:])
    else:
        produce(bus, cfg.run, "trajectories", records)
        proc = start(config, "post_rollout", tmp_path, fault)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.communicate()[1]

    restarted = start(config, "post_rollout", tmp_path)
    # until the restarted stage has written every group *and* every group's stats (waiting for
    # the groups alone, one CI run stopped it before it wrote the stats of the last group)
    counters = finish(restarted, lambda: all(
        set(got) >= set(want) for got, want in zip(outputs_fast(bus, cfg.run),
                                                   (want_groups, want_stats), strict=True)))
    groups, stats = outputs(bus, cfg.run)
    assert set(groups) == set(want_groups) and set(stats) == set(want_stats)
    # counters are state: after the crash they count every record exactly once
    assert policy_counters(counters) == policy_counters(ref_counters)
    if fault.startswith(("after_checkpoint", "after_flush")):  # the outbox was produced again
        assert counters["runner.recovered_out"] > 0
    bus.close()
    ref_bus.close()


def outputs_fast(bus, run: str) -> tuple[list[str], list[str]]:
    """:func:`outputs`, without reading while either topic is still empty."""
    if 0 in (end_count(bus, topic_name(run, "groups", "default")),
             end_count(bus, topic_name(run, "stats"))):
        return [], []
    return outputs(bus, run)


def test_sigkilled_batch_stage_puts_every_group_in_exactly_one_batch(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    data = {"batch": ["replay", "batcher"], "batch_size": 4, "poll_records": 3,
            "commit_interval_s": 0.001, "replay": {"ratio": 0.25, "max_staleness": 100}}
    cfg = make_config(data)
    bus = open_bus(cfg, tmp_path)
    groups = [tgroup(f"g{i}#0", [1, 0, i % 2]) for i in range(60)]
    produce(bus, cfg.run, "groups", groups, policy="default")
    config = write_config(cfg, tmp_path / "batch.yaml")
    proc = start(config, "batch", tmp_path, "after_flush:4")
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.communicate()[1]
    topic = topic_name(cfg.run, "batches", "default")
    # 60 fresh groups, 3 fresh + 1 replayed per batch after the first (4 fresh)
    restarted = start(config, "batch", tmp_path)
    finish(restarted, lambda: len({b.id for b in read_all(bus, topic)}) >= 19)
    by_id: dict[str, Batch] = {}
    for b in read_all(bus, topic):
        assert by_id.setdefault(b.id, b).groups == b.groups  # a duplicate is identical
    assert sorted(by_id) == sorted(f"default-{i}" for i in range(19))
    fresh = Counter(g.group_id for b in by_id.values() for g in b.groups if not g.replayed)
    # 4 + 18 * 3 fresh groups are batched (2 wait for the next batch), none twice
    assert len(fresh) == 58 and max(fresh.values()) == 1
    assert set(fresh) <= {f"g{i}#0" for i in range(60)}
    assert sum(g.replayed for b in by_id.values() for g in b.groups) == 18
    bus.close()
