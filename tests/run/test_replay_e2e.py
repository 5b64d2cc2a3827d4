"""`astraflow replay RUN_DIR` on a finished quickstart run: every version the run published is
reproduced bit for bit by a fresh trainer fed the run's batches from its bus, and when one
trajectory of a recorded batch is altered on the bus the replay names the first version that
differs and exits 1 (astraflow/run/replay.py, docs/trainer.md#replay)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from run_helpers import ROOT, check_finished, replayed, run_astraflow
from test_quickstart_e2e import QUICKSTART

from astraflow.core.records import Batch, Trajectory, decode, encode
from astraflow.run.replay import trained_steps

STEPS = 8
ALTERED = 5  # the step whose batch gets one altered trajectory


def replay(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "astraflow.cli.app", "replay", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_is_replayed_bit_for_bit_and_an_altered_batch_is_named(
        tmp_path: Path, quickstart_warm: Path) -> None:
    out = tmp_path / "run"
    sets = [f"models.default.path={quickstart_warm}", "models.default.build=none",
            "launch.warmup.steps=0", "launch.evaluate=false", f"trainer.max_steps={STEPS}",
            "launch.timeout_s=300"]
    rc, output = run_astraflow(["run", str(QUICKSTART), "--out", str(out), "--no-live",
                                *[a for s in sets for a in ("--set", s)]], out, timeout=400)
    check_finished(out, rc, output, steps=STEPS, per_step=64 * 8)

    assert f"default: {STEPS} versions reproduced bit for bit" in replayed(out, "default")

    # one trajectory of step ALTERED's batch gets another reward, on the bus itself
    step = trained_steps(out / "trainer-default.jsonl")[ALTERED - 1]
    assert step.version == ALTERED
    db = sqlite3.connect(out / "bus.db")
    where = "WHERE topic=? AND partition=? AND offset=?"
    try:
        (value,) = db.execute(f"SELECT value FROM messages {where}",
                              (step.topic, step.partition, step.offset)).fetchone()
        group = decode(value, Batch).groups[0]  # type: ignore[union-attr]
        if group.refs:  # the batch names its trajectories: alter the record it names
            ref = group.refs[0]
            at = (ref.topic, ref.partition, ref.offset)
            (tv,) = db.execute(f"SELECT value FROM messages {where}", at).fetchone()
            t = decode(tv, Trajectory)
            new = encode(msgspec.structs.replace(t, reward=1.0 - t.reward))  # type: ignore
        else:  # the batch carries them
            batch = decode(value, Batch)
            t = group.trajectories[0]
            groups = [msgspec.structs.replace(group, trajectories=[
                msgspec.structs.replace(t, reward=1.0 - t.reward), *group.trajectories[1:]]),
                *batch.groups[1:]]  # type: ignore[union-attr]
            at = (step.topic, step.partition, step.offset)
            new = encode(msgspec.structs.replace(batch, groups=groups))  # type: ignore
        db.execute(f"UPDATE messages SET value=? {where}", (new, *at))
        db.commit()
    finally:
        db.close()
    r = replay(out)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert f"default: version {ALTERED} differs (batch " in r.stdout, r.stdout
    assert "tensor '" in r.stdout and "where the run published blake3:" in r.stdout
