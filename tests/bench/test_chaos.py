"""The chaos injector and bench/chaos.py's checks (docs/chaos.md).

Fast tests: the seeded plan, role kinds, the recovery arithmetic, and that every check fails on
the data it exists to catch (versions going back, an unexplained restart, a failed role, a
batch trained out of the logged order). The slow one runs bench/chaos.py itself, reduced: the
quickstart's dataflow on a tiny untrained model on the embedded bus, counted in trainer steps
(faults at given steps, the run stopped 20 steps past the last one), with a
rollout worker killed, a trainer or stage killed mid-checkpoint and right after one, a delta
blob corrupted (and a worker forced through it), the run directory's disk filled (where a loop
mount works) and the weight server's link cut (where Toxiproxy is installed); then every check
must pass, the trainer's weights bit for bit those of a replay of its batches."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import chaos as bench
from bench.lib.chaos import (
    Fault,
    Injector,
    StepWatch,
    blob_to_corrupt,
    flip_bytes,
    role_kind,
    schedule,
)
from bench.lib.recovery import Beat, recover, restarts, versions_backwards


def test_the_plan_is_seeded_and_covers_every_kind() -> None:
    kinds = ["kill", "blob_corrupt", "disk_full"]
    a = schedule(7, 6.0, 600, kinds, start_s=10, min_gap_s=2)
    assert a == schedule(7, 6.0, 600, kinds, start_s=10, min_gap_s=2)
    assert a != schedule(8, 6.0, 600, kinds, start_s=10, min_gap_s=2)
    assert {k for _, k in a} == set(kinds)
    times = [t for t, _ in a]
    assert times == sorted(times) and times[0] >= 12 and times[-1] < 600
    assert all(b - a >= 2 for a, b in zip(times, times[1:], strict=False))
    with pytest.raises(Exception, match="unknown fault kinds"):
        schedule(0, 1.0, 60, ["kill", "meteor"])


def test_a_plan_in_steps_waits_for_the_steps_the_run_reports(tmp_path: Path) -> None:
    """--steps-after: a fault is made once metrics.jsonl reports its step, however long that
    takes (no clock in it), and `done` says when the plan is made."""
    import threading

    metrics = tmp_path / "metrics.jsonl"
    watch = StepWatch(metrics)
    assert watch() == 0  # no file yet
    made: list[int] = []
    inj = Injector(tmp_path, [(3, "noop"), (5, "noop")], seed=0, log_path=tmp_path / "f.jsonl",
                   progress=watch)
    inj.inject = lambda kind: made.append(watch()) or Fault(0, kind, "", 0.0)  # type: ignore[method-assign]
    thread = threading.Thread(target=inj.run, daemon=True)
    thread.start()
    with metrics.open("a") as f:
        for step in range(1, 7):
            assert step > 5 or not inj.done.is_set()  # set only once step 5 is reported
            f.write(json.dumps({"role": "trainer", "step": step}) + "\n")
            f.write('{"role": "rollout", "episodes": 3}\n')
            f.flush()
            if step in (3, 5):
                for _ in range(100):  # the injector polls every 0.1 s
                    if len(made) == (1 if step == 3 else 2):
                        break
                    threading.Event().wait(0.05)
            assert len(made) == (0 if step < 3 else 1 if step < 5 else 2), (step, made)
        f.write('{"step": 99')  # a line still being written: not counted yet
    assert inj.done.wait(5) and made == [3, 5]
    assert watch() == 6
    inj.stop()
    thread.join(5)


def test_role_kinds() -> None:
    pol = ["default", "solver"]
    assert role_kind("rollout-3", pol) == "rollout"
    assert role_kind("trainer-default", pol) == "trainer"
    assert role_kind("policy-batch-solver", pol) == "policy-batch"
    assert role_kind("policy-post", pol) == "policy-post"
    assert role_kind("evaluator-team", pol) == "evaluator-team"


def test_the_blob_corrupted_is_the_newest_delta_without_a_full(tmp_path: Path) -> None:
    d = tmp_path / "default"
    d.mkdir()
    for name in ("v0000000001.full.aa.afw", "v0000000002.delta.bb.afw",
                 "v0000000003.delta.cc.afw", "v0000000003.full.cc.afw",
                 "v0000000004.delta.dd.afw"):  # the newest: its full may be on its way
        (d / name).write_bytes(bytes(range(256)) * 4)
    blob = blob_to_corrupt([d])
    assert blob is not None and blob.name == "v0000000002.delta.bb.afw"
    # a corruption at 2 is passed only by the full at 3: nothing more to corrupt until a
    # full lies above the last one corrupted
    assert blob_to_corrupt([d], after=2) is None
    assert blob_to_corrupt([d], after=3) is None
    before = blob.read_bytes()
    offsets = flip_bytes(blob, random.Random(0), n=8)
    after = blob.read_bytes()
    assert [i for i in range(len(before)) if before[i] != after[i]] == offsets
    assert all(i >= len(before) // 2 for i in offsets)


def beat(ts: float, pid: int, role: str = "rollout", status: str = "running",
         **gauges: float) -> Beat:
    return Beat(ts, pid, role, status, gauges)


def test_recovery_of_a_kill_and_of_a_lasting_fault() -> None:
    history = {"rollout-0": [(0.0, 10), (100.5, 11)], "trainer-default": [(0.0, 20)]}
    beats = [beat(90, 10), beat(95, 20, "trainer", step=5), beat(103, 11, status="starting"),
             beat(104.2, 11, **{"weight_version": 5}), beat(110, 20, "trainer", step=6),
             beat(130, 11), beat(131, 20, "trainer")]
    kill = Fault(0, "kill", "rollout-0", 100.0, 100.0, {"pid": 10})
    disk = Fault(1, "disk_full", "/x", 120.0, 125.0, {"live": ["rollout-0", "trainer-default"]})
    recover([kill, disk], beats, history)
    assert kill.details["new_pid"] == 11
    assert kill.recovery_s == pytest.approx(4.2)  # the first *running* heartbeat
    assert disk.recovery_s == pytest.approx(6.0)  # the slower of the two roles
    # a role that stops heartbeating is not recovered: no number is made up
    lost = Fault(2, "disk_full", "/x", 120.0, 125.0, {})
    recover([lost], [b for b in beats if b.pid != 20 or b.ts < 125], history)
    assert lost.recovery_s is None and lost.details["not_recovered"] == ["trainer-default"]


def test_versions_going_back_are_found() -> None:
    ok = [beat(1, 1, **{"weight_version.default": 1}), beat(2, 1, **{"weight_version.default": 3})]
    assert versions_backwards(ok) == []
    bad = [*ok, beat(3, 1, **{"weight_version.default": 2})]
    assert versions_backwards(bad) == ["pid 1 policy default: 3 -> 2 at 3.0"]
    rows = {"w": [(1.0, 0, 0, {"default": 2}), (2.0, 1, 0, {"default": 1})]}
    assert bench.versions_going_back(rows) == ["w default: 2 -> 1"]
    rows = {"w": [(1.0, 0, 5, {"default": 1}), (2.0, 0, 4, {"default": 1})]}
    assert "out of created_at order" in bench.versions_going_back(rows)[0]


def test_restarts_are_explained_or_flagged() -> None:
    history = {"trainer-default": [(0.0, 1), (50.2, 2), (80.0, 3), (300.0, 4)]}
    faults = [Fault(0, "kill_in_checkpoint", "trainer-default", 50.0, 50.0, {"pid": 1}),
              Fault(1, "broker_restart", "broker", 70.0, 75.0, {})]
    r = restarts(faults, history, ["default"])["trainer-default"]
    assert r["injected"] == 1 and r["secondary"] == ["broker_restart at 80.0"]
    assert r["unexplained"] == ["300.0"]
    loops = bench.crash_loops({"failed_roles": ["rollout-1"],
                               "roles": {"rollout-0": {"exit": -9}, "producer": {"exit": 0}}},
                              {"trainer-default": r})
    assert loops == ["rollout-1 failed (restarts exhausted)", "rollout-0 ended with exit -9",
                     "trainer-default restarted with no fault to explain it at ['300.0']"]


def test_the_replay_order_is_checked_against_the_trainers_log(tmp_path: Path) -> None:
    log = tmp_path / "trainer-default.jsonl"
    seq = [SimpleNamespace(id=i) for i in ("a", "b", "c")]
    # step 2 trained twice (a crash after it, before a checkpoint): the last line counts
    log.write_text("\n".join(json.dumps(r) for r in (
        {"step": 1, "batch_id": "a"}, {"step": 2, "batch_id": "x"}, {"event": "start"},
        {"step": 2, "batch_id": "b"}, {"step": 3, "batch_id": "c"})) + "\n{\"step\": 4, ")
    assert bench._logged_order(log, seq) == []
    assert bench._logged_order(log, [seq[0], seq[2], seq[1]]) == [
        "step 2: log b replay c", "step 3: log c replay b"]


def test_a_corrupted_blob_is_superseded_only_when_no_route_can_reach_it() -> None:
    # v62's blob (published at t=5) corrupted at t=8, the restarted worker synced by t=13
    blob = "v0000000062.delta.old.afw"
    fault = Fault(id=5, kind="blob_corrupt", target=f"/w/default/{blob}", t=8.0,
                  details={"version": 62}, recovery_s=5.0)
    old = [(60, "full", 1.0, "v60.full"), (61, "delta", 4.0, "v61.old"), (62, "delta", 5.0, blob)]
    assert not bench.superseded(fault, old)
    # the old chain going on past it: routes still read it
    assert not bench.superseded(fault, [*old, (63, "delta", 9.0, "v63.old")])
    # a full of a later version before the sync: routes start there
    assert bench.superseded(fault, [*old, (80, "full", 12.0, "v80.full")])
    assert not bench.superseded(fault, [*old, (80, "full", 14.0, "v80.full")])  # too late
    # a trainer restarted from v60 republished v61 and v62 under new names
    assert bench.superseded(fault, [*old, (61, "delta", 8.8, "v61.new"),
                                    (62, "delta", 8.9, "v62.new")])
    # ... or coalesced 62..67 into 68: the new chain passes the version without a v62
    assert bench.superseded(fault, [*old, (61, "delta", 8.8, "v61.new"),
                                    (68, "delta", 8.9, "v68.new")])
    # a republish that has not reached v62 by the sync: the worker may still read the blob
    assert not bench.superseded(fault, [*old, (61, "delta", 8.8, "v61.new"),
                                        (68, "delta", 13.5, "v68.new")])
    # no recovery measured: nothing to say
    assert not bench.superseded(Fault(id=5, kind="blob_corrupt", target=f"/w/{blob}", t=8.0,
                                      details={"version": 62}), old)


def test_a_failed_check_shows_what_the_restarted_process_logged(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rollout-0.log").write_text(
        "\n=== start 10:00:00 astraflow rollout\nold warning\n"
        "\n=== start 10:00:30 astraflow rollout\n" + "".join(f"line {i}\n" for i in range(20)))
    tail = bench.last_start(tmp_path, "rollout-0", lines=5)
    assert tail == [f"line {i}" for i in range(15, 20)]  # this start's, not the one before
    assert bench.last_start(tmp_path, "rollout-0", lines=100)[1:] == \
        [f"line {i}" for i in range(20)]
    assert bench.last_start(tmp_path, None) == [] and bench.last_start(tmp_path, "gone") == []
    fault = Fault(id=5, kind="blob_corrupt", target="/w/default/v44.delta.afw", t=100.0,
                  details={"version": 44, "forced_sync": "rollout-0", "new_pid": 7})
    manifests = {"default": [(40, "full", 90.0, "v40.full"), (44, "delta", 99.0, "v44.delta.afw"),
                             (43, "delta", 101.4, "v43.new")]}
    got = bench.undetected_details(fault, tmp_path, manifests)
    assert got["version"] == 44 and got["new_pid"] == 7 and got["recovery_s"] is None
    assert got["log_of_restart"] == [f"line {i}" for i in range(5, 20)]
    # from 5 s before the fault, times relative to it
    assert got["manifests"] == [(44, "delta", -1.0, "v44.delta.afw"), (43, "delta", 1.4, "v43.new")]
    # the policy's trainer: no log of its own here
    assert got["trainer"] == {"starts": [], "last_step": None} and got["trainer_log"] == []
    (tmp_path / "trainer-default.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"event": "start", "version": 0, "time": 50.0}, {"step": 44, "time": 99.0},
        {"event": "start", "version": 42, "time": 101.5}, {"step": 43, "time": 101.9},
        {"step": 50, "time": 104.0}]) + '\n{"step": 51, "ti')  # the last line cut by a kill
    (logs / "trainer-default.log").write_text("=== start 10:00:41 astraflow train\nresumed\n")
    got = bench.undetected_details(fault, tmp_path, manifests)
    assert got["trainer"] == {"starts": [(-50.0, 0), (1.5, 42)], "last_step": (50, 4.0)}
    assert got["trainer_log"][1:] == ["resumed"]  # after the start line's rest


REDUCED = ["--warm", "none", "--seconds", "300", "--steps-after", "20", "--bus", "embedded",
           "--hold", "3,4",
           "--disk-mb", "768",
           "--set", "data.batch_size=4", "--set", "producer.n_samples=4",
           "--set", "launch.rollout_workers=1", "--set", "launch.evaluate=false",
           "--set", "data.max_staleness=4",
           "--set", "trainer.checkpoint_every=3", "--set", "weights.full_every=20",
           # a trainer starved for 5 s publishes its newest version again as a full (the
           # default waits 60 s, this whole run): the worker held back by the corrupted delta
           # gets past it and the run goes on (without: 2 CI runs and 2 of 3 runs here on
           # loaded cores stopped a few versions past the corrupted one, the worker's data
           # too stale to train on and no next full ever made)
           "--set", "weights.refresh_full_after_s=5",
           # an untrained model scores 0: zero-advantage groups must still move the weights,
           # else every version is the same and the replay compares nothing
           "--set", "trainer.loss.entropy_coef=0.05",
           "--set", "trainer.skip_zero_advantage_groups=false",
           "--set", "trainer.optimizer.warmup_steps=0"]


@pytest.mark.slow
@pytest.mark.alone  # faults and length are counted in steps, but the whole run is heavy:
# alone, its hang guards (--seconds 300, 420 s) stay far from its length on loaded cores
@pytest.mark.timeout(420)
def test_the_reduced_chaos_bench_survives(tmp_path: Path) -> None:
    from bench.lib.disk import can_mount
    from bench.lib.wan import find_toxiproxy

    # counted in trainer steps, not seconds (--steps-after): each fault is made once the run
    # reports that step, and the run is stopped 20 steps past the last fault and past the
    # corrupted version, however fast this machine is (a plan in seconds put the faults at
    # other points of training on a slower host and ended the run wherever 60 s fell)
    plan = ["5:kill", "10:kill_in_checkpoint", "15:kill_after_checkpoint"]
    if find_toxiproxy() is not None:
        plan.append("20:link_cut")
    if can_mount() is None:
        plan.append("25:disk_full")
    # last: a worker is held below it until the next full; the run goes on 20 steps past
    # it, for the worker killed with it to restart and sync through it
    plan.append("35:blob_corrupt")
    out = tmp_path / "chaos"
    code = bench.main([*REDUCED, "--out", str(out), "--startup", "0", "--plan", ",".join(plan)])
    result = json.loads((out / "chaos.json").read_text())
    failed = {k: c for k, c in result["checks"].items() if c["ok"] is False}
    assert code == 0 and not failed, json.dumps(failed, indent=1, default=str)
    faults = {f["kind"]: f for f in result["faults"]}
    assert all(f["skipped"] is None for f in faults.values()), faults
    killed = {f["details"]["role_kind"] for f in result["faults"] if "role_kind" in f["details"]}
    assert len(killed) >= 2, killed  # kills of different role kinds
    # the corrupted version is passed only at the next full snapshot, maybe after the run
    assert all(f["recovery_s"] is not None for k, f in faults.items() if k != "blob_corrupt"), \
        faults
    blob = faults["blob_corrupt"]["details"]
    # met and refused (heal lines), or passed over by a newer full snapshot before the
    # restarted worker synced (then nothing read it): corruption_detected says which
    assert blob["detected"] >= 1 or blob["superseded"], blob
    # and the run went on: the trainer got past the next full after the corrupted version
    # (stalled runs stopped 4-6 versions past it; the others reach hundreds of steps)
    assert result["trainer_steps"] >= blob["version"] + 20, (result["trainer_steps"], blob)
    replay = result["checks"]["replay"]["default"]
    assert replay["ok"] and replay["steps"] >= 5 and replay["tensors_differing"] == 0
    acc = result["accounting"]
    assert acc["produced"] > 0 and acc["unaccounted"] == 0 and acc["trained_twice"] == 0
