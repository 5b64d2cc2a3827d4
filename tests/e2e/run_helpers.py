"""Shared by the end-to-end run tests: launching `astraflow run` so that nothing outlives the
test, the checks of a run that finished, and its trainer's rewards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# the trainer's rewards per RL step (bench/learning.py reads them with it too)
from bench.lib.runlog import train_rewards  # noqa: F401  (the run tests import it from here)

ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 60.0
#: groups a training batch in the runs that check faults and records, not learning (the
#: quickstart trains on 64): 16 groups x 8 samples, a quarter of the work of every step (a
#: 20-step quickstart run from the warm model: 16.6 CPU-s in all here, against 38.6)
SMALL_BATCH = 16


@contextlib.contextmanager
def launched(args: Sequence[str], out: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``python -m astraflow.cli.app *args``, a run writing to ``out``, with its output in a file
    beside ``out`` (no pipe that fills while nobody reads it). Yields the process and that
    file. However the block is left (the test's own timeout included), a run still going is
    stopped: SIGINT (it stops every role), then after STOP_GRACE_S a SIGKILL to it and to each
    role's process group (roles run in sessions of their own, processes.json)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}-output.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "astraflow.cli.app", *args], cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            yield proc, log_path
        finally:
            if proc.poll() is None:
                stop_run(proc, out)


def stop_run(proc: subprocess.Popen[str], out: Path) -> None:
    """Stop a run still going (see :func:`launched`)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
    pids = out / "processes.json"
    with contextlib.suppress(OSError, ValueError):
        for pid in json.loads(pids.read_text()).values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGKILL)


def run_astraflow(args: Sequence[str], out: Path, *, timeout: float) -> tuple[int, str]:
    """Run ``astraflow *args`` (a run writing to ``out``) to its end, within ``timeout`` seconds
    (else ``subprocess.TimeoutExpired``, the run stopped as :func:`launched` stops it).
    Returns its exit code and output."""
    with launched(args, out) as (proc, log):
        rc = proc.wait(timeout)
        return rc, log.read_text()


def check_finished(out: Path, rc: int, output: str, *, steps: int,
                   per_step: int) -> dict[str, Any]:
    """The run in ``out`` exited 0 with no failed role after ``steps`` trainer steps, every
    trajectory accounted for (none lost, none trained twice) and ``per_step`` trajectories
    trained a step. Returns its summary."""
    assert rc == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_roles"] == [], summary["roles"]
    assert summary["trainer_steps"] == steps
    acc = summary["accounting"]
    assert acc["unaccounted"] == 0 and acc["trained_twice"] == 0, acc
    assert acc["trained"] == steps * per_step, acc
    return summary


def replayed(out: Path, *policies: str) -> str:
    """`astraflow replay OUT` exits 0 and reports every policy's versions (``policies``) as
    reproduced bit for bit; its output."""
    r = subprocess.run([sys.executable, "-m", "astraflow.cli.app", "replay", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    for p in policies:
        assert any(line.startswith(f"{p}: ") and "versions reproduced bit for bit" in line
                   for line in r.stdout.splitlines()), r.stdout
    return r.stdout
