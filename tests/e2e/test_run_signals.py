"""`astraflow run` stops gracefully on SIGINT and on SIGTERM, also when it was started with
SIGINT ignored (nohup, a background job of a script): every role stopped, the summary
written. Before, SIGINT did nothing there and SIGTERM ended the orchestrator at once, leaving
the roles (in sessions of their own) running unattended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_helpers import launched
from waiting import alive

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_every_role_and_writes_the_summary(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "run"
    sets = ["launch.warmup.steps=0", "launch.evaluate=false", "launch.timeout_s=120",
            "launch.stop_grace_s=10", f"run=sig{int(sig)}{os.getpid()}"]
    # SIGINT ignored, as under nohup: set by a shell before exec (a preexec_fn would run
    # Python in a fork of this many-threaded process, which can deadlock before the exec)
    proc = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec "$@"', "sh", sys.executable, "-m", "astraflow.cli.app",
         "run", str(ROOT / "examples" / "quickstart.yaml"),
         "--out", str(out), "--no-live", *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists() or not (out / "processes.json").exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the run started no role in time"
            time.sleep(0.2)
        pids = list(json.loads((out / "processes.json").read_text()).values())
        time.sleep(2.0)  # the roles at work
        proc.send_signal(sig)
        text = proc.communicate(timeout=90)[0]
        assert (out / "summary.json").exists(), text[-3000:]
        assert "interrupted: stopping every role" in text, text[-3000:]
        deadline = time.monotonic() + 15
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if alive(p)], "roles outlived the run"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in pids:
            if alive(p):
                os.killpg(p, signal.SIGKILL)


@pytest.mark.slow
def test_roles_stop_themselves_when_the_run_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves `astraflow run` no chance to stop its roles: each role sees its launcher
    gone and stops itself (astraflow/core/launcher.py), through its own SIGTERM handling."""
    out = tmp_path / "run"
    sets = ["launch.warmup.steps=0", "launch.evaluate=false", "launch.timeout_s=120",
            f"run=orphan{os.getpid()}"]
    args = ["run", str(ROOT / "examples" / "quickstart.yaml"), "--out", str(out), "--no-live",
            *[a for s in sets for a in ("--set", s)]]
    pids: dict[str, int] = {}
    with launched(args, out) as (proc, _log):
        try:
            deadline = time.monotonic() + 120
            while not (out / "metrics.jsonl").exists() or not (out / "processes.json").exists():
                assert proc.poll() is None, "the run ended before its roles were at work"
                assert time.monotonic() < deadline, "the run started no role in time"
                time.sleep(0.2)
            pids = json.loads((out / "processes.json").read_text())
            time.sleep(2.0)  # the roles at work
            proc.kill()
            proc.wait(10)
            deadline = time.monotonic() + 60
            while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not [r for r, p in pids.items() if alive(p)], "roles outlived the killed run"
            for role in pids:  # each said why it stopped
                log = (out / "logs" / f"{role}.log").read_text()
                assert "the launcher of this role (astraflow run, pid" in log, (role, log[-2000:])
        finally:
            for p in pids.values():
                if alive(p):
                    os.killpg(p, signal.SIGKILL)
