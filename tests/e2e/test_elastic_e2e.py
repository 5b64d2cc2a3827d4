"""The scaler in `astraflow run`, end to end through the real CLI: the quickstart with its
rollout slowed on purpose (``rollout.engine.latency``: slow requests, then fast ones, by the
wall clock), a trainer slowed too (one sequence per
forward/backward, every group trained), one rollout process to start with and the scaler
between 1 and 3. Slow requests starve the trainer (the pool must grow); fast ones let a full
pool outrun it (the pool must shrink, its retired workers draining). Nothing may be lost or
trained twice. bench/elastic.py is the measured version of this run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def scaled_down(out: Path, log: Path) -> bool:
    """The scaler has retired a worker and the worker has drained and stopped."""
    decisions = out / "scaler.jsonl"
    if not decisions.exists():
        return False
    text = decisions.read_text()
    lines = text[:text.rfind("\n") + 1].splitlines()  # whole lines: the scaler may be writing
    down = any(d["target"] < d["current"] for d in map(json.loads, lines))
    return down and "stopped (scale-down" in log.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.alone  # its phases are timed by the wall clock
@pytest.mark.timeout(480)
def test_the_scaler_grows_and_shrinks_the_pool_and_nothing_is_lost(tmp_path: Path) -> None:
    sets = [
        "launch.warmup.steps=0", "launch.evaluate=false", "launch.timeout_s=240",
        "launch.rollout_workers=1",
        # 35 s of slow requests, then fast ones, from about when RL starts. The run is stopped
        # (SIGINT) once a scale-down has drained its worker, at most launch.timeout_s in: one
        # run measured up at 9 s, the two scale-downs 48 s and 61 s after the slow phase began;
        # a slower host takes longer, and a fixed length failed there once
        "rollout.engine.latency={type: phases, phases: [[2.0, 35], [0.2, 600]], "
        f"start: {time.time() + 5:.0f}}}",
        "rollout.max_concurrent_episodes=384", "rollout.engine.max_batch_size=384",
        "trainer.micro_batch_tokens=16", "trainer.skip_zero_advantage_groups=false",
        "scale.enabled=true", "scale.pools.rollout.min_workers=1",
        "scale.pools.rollout.max_workers=3", "scale.report_every_steps=5",
        "scale.report_every_s=10", "scale.min_window_s=4", "scale.cooldown_s=10",
        "scale.confirm=1",
    ]
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "astraflow.cli.app", "run", str(QUICKSTART), "--out",
             str(out), "--no-live", *[a for s in sets for a in ("--set", s)]],
            cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 420
            while proc.poll() is None and time.monotonic() < deadline:
                if scaled_down(out, log):
                    time.sleep(3.0)  # the reports and metrics after it
                    proc.send_signal(signal.SIGINT)
                    break
                time.sleep(0.5)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, output[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_roles"] == [], summary["roles"]
    acc = summary["accounting"]
    assert acc["unaccounted"] == 0 and acc["trained_twice"] == 0, acc

    decisions = [json.loads(x) for x in (out / "scaler.jsonl").read_text().splitlines()]
    acted = [d for d in decisions if d["target"] != d["current"]]
    assert all(d["actuation"]["ok"] for d in acted)
    ups = [d for d in acted if d["target"] > d["current"]]
    downs = [d for d in acted if d["target"] < d["current"]]
    assert ups and ups[0]["zone"] == "starved", decisions
    assert downs and all(d["zone"] == "idle" for d in downs), decisions
    assert all(1 <= d["target"] <= 3 for d in acted)
    # the retired workers drained and exited 0; the supervisor restarted none of them
    retired = {line.split()[1] for line in output.splitlines()
               if "stopped (scale-down" in line}
    assert retired, output[-3000:]
    for role in retired:
        assert summary["roles"][role]["exit_codes"] == [0], summary["roles"][role]
        assert summary["roles"][role]["restarts"] == 0
    # the reports the scaler read are on the bus, one per decision
    reports = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.app", "inspect", "af.quickstart.reports",
         "--bus", f"embedded://{out}/bus.db", "--limit", "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert reports.returncode == 0, reports.stderr
    assert reports.stdout.count('"LoadReport"') >= len(decisions) > 0
