"""A whole run SIGKILLed at once — `astraflow run` and every role's process group in the same
instant, as a power cut or an OOM killer would leave it — and `astraflow run --resume` in the
same directory finishes it: every trainer step taken once (the budget, exactly), every
trajectory generated before the kill either trained or accounted as filtered, nothing trained
twice (docs/results/faults.md)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from run_helpers import (
    SMALL_BATCH,
    check_finished,
    launched,
    replayed,
    run_astraflow,
    train_rewards,
)
from test_quickstart_e2e import QUICKSTART, trainer_step
from waiting import alive, eventually

STEPS = 20
KILL_AT = 12  # after the checkpoint at 10 (checkpoint_every 5): steps 11-12 are redone


def kill_everything(proc_pid: int, out: Path) -> list[int]:
    """SIGKILL the run and every role's process group at once; the pids killed."""
    pids = [int(p) for p in json.loads((out / "processes.json").read_text()).values()]
    os.kill(proc_pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return pids


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_killed_whole_resumes_and_loses_no_rollout(tmp_path: Path,
                                                         quickstart_warmup: Path) -> None:
    out = tmp_path / "run"
    sets = [f"trainer.max_steps={STEPS}", "trainer.checkpoint_every=5", "launch.evaluate=false",
            "launch.timeout_s=400", f"data.batch_size={SMALL_BATCH}"]
    args = ["run", str(QUICKSTART), "--out", str(out), "--no-live", "--warm",
            str(quickstart_warmup), *[a for s in sets for a in ("--set", s)]]
    killed: list[int] = []
    with launched(args, out) as (proc, _log):
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if trainer_step(out) >= KILL_AT:
                killed = kill_everything(proc.pid, out)
                break
            time.sleep(0.2)
        proc.wait(30)
    assert killed, "the run ended before the kill"
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()  # nobody wrote an ending
    # every role is gone (a SIGKILLed process runs on for a moment while the kernel tears it
    # down): nothing of the first run writes on
    assert eventually(lambda: not any(alive(pid) for pid in killed), 30), [
        pid for pid in killed if alive(pid)]

    rc, output = run_astraflow([*args, "--resume"], out, timeout=600)
    summary = check_finished(out, rc, output, steps=STEPS, per_step=SMALL_BATCH * 8)
    acc = summary["accounting"]
    # every trajectory ever produced (before the kill and after) has one fate
    assert acc["produced"] == sum(v for k, v in acc.items()
                                  if k not in ("produced", "unaccounted", "trained_twice")), acc
    rows = [json.loads(x) for x in (out / "trainer-default.jsonl").read_text().splitlines()]
    starts = [r for r in rows if r.get("event") == "start"]
    # resumed from a checkpoint (every 5 steps) at or after the one before the kill
    assert len(starts) == 2 and starts[1]["resumed"], starts
    assert starts[1]["version"] >= 10 and starts[1]["version"] % 5 == 0, starts
    assert len(train_rewards(out)) == STEPS
    # the versions of both lives of the trainer, retrained from the log, bit for bit
    replayed(out, "default")
