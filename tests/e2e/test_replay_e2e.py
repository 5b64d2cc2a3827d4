"""`astraflow replay`, `retrain` and `compare` on one finished quickstart run with a LoRA
trainer (docs/trainer.md#replay, #retrain):

* replay: every adapter version the run published is reproduced bit for bit by a fresh trainer
  fed the run's batches from its bus; when one trajectory of a recorded batch is altered on the
  bus, the replay names the first version that differs and exits 1;
* retrain with nothing changed measures exactly the run's held-out accuracy at every version its
  evaluator measured (the same weights reach the same evaluation); with a trainer key changed it
  measures the counterfactual at the same versions; compare puts both side by side.

Runs without an adapter are replayed in the resume, team and gateway-agent tests."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from run_helpers import ROOT, SMALL_BATCH, check_finished, replayed, run_astraflow
from test_quickstart_e2e import QUICKSTART

from astraflow.core.records import Batch, Trajectory, decode, encode
from astraflow.run.replay import trained_steps
from astraflow.run.retrain import run_evals

STEPS = 8
ALTERED = 5  # the step whose batch gets one altered trajectory


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "astraflow.cli.app", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def replay(out: Path) -> subprocess.CompletedProcess[str]:
    return cli("replay", str(out))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_is_replayed_bit_for_bit_and_an_altered_batch_is_named(
        tmp_path: Path, quickstart_warm: Path) -> None:
    out = tmp_path / "run"
    sets = [f"models.default.path={quickstart_warm}", "models.default.build=none",
            "launch.warmup.steps=0", f"trainer.max_steps={STEPS}", "launch.eval_every=4",
            "launch.eval_problems=100", "trainer.lora={r: 8, alpha: 16}",
            "trainer.optimizer.lr=1.0e-3", "launch.timeout_s=300", f"data.batch_size={SMALL_BATCH}"]
    rc, output = run_astraflow(["run", str(QUICKSTART), "--out", str(out), "--no-live",
                                *[a for s in sets for a in ("--set", s)]], out, timeout=400)
    check_finished(out, rc, output, steps=STEPS, per_step=SMALL_BATCH * 8)

    assert f"default: {STEPS} versions reproduced bit for bit" in replayed(out, "default")

    evals = run_evals(out, "default")
    assert 0 in evals and STEPS in evals, evals
    same = tmp_path / "same"
    r = cli("retrain", str(out), "--out", str(same))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert run_evals(same, "default") == evals  # the same data and trainer: the same curve
    other = tmp_path / "masked"
    r = cli("retrain", str(out), "--out", str(other), "--set",
            "trainer.loss.behaviour_cap_mode=mask_both", "--set", "trainer.loss.behaviour_cap=1.05")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert set(run_evals(other, "default")) == set(evals)
    config = (other / "config.yaml").read_text()
    assert "behaviour_cap_mode: mask_both" in config and "behaviour_cap: 1.05" in config
    r = cli("compare", str(out), str(other))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "| step | run | masked | difference |" in r.stdout, r.stdout
    assert (other / "compare.png").stat().st_size > 10_000
    r = cli("retrain", str(out), "--out", str(tmp_path / "no"), "--set", "producer.epochs=3")
    assert r.returncode == 1 and "retrain changes the trainer only" in r.stderr + r.stdout

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
    # the tensors compared are the adapter's (the manifests of a LoRA trainer carry only it)
    assert "tensor '" in r.stdout and "lora_" in r.stdout, r.stdout
    assert "where the run published blake3:" in r.stdout
