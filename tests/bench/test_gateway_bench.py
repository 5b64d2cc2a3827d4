"""bench/gateway.py on a tiny budget: both arms answer every request (the gateway's through HTTP,
recorded in memory and on a bus) and the table has a row per arm and concurrency with a ratio.
Not timings: nothing here gates on wall-clock time."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gateway_bench_runs_every_arm() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gateway", "--sessions", "1", "4",
         "--requests", "16", "--repeats", "1"], cwd=ROOT, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()
            if re.match(r"\| \d+ \|", line)]
    arms = {(int(r[0]), r[1].strip()) for r in rows}
    assert arms == {(c, a) for c in (1, 4)
                    for a in ("direct", "gateway (memory)", "gateway (bus)")}, proc.stdout
    for r in rows:
        rps, batch, ratio = (float(r[i].replace(",", "")) for i in (2, 5, 6))
        assert rps > 0 and 1 <= batch <= 4 and ratio > 0, r
        if r[1].strip() == "direct":
            assert ratio == 1.0
