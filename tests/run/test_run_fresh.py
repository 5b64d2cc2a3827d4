"""A fresh `astraflow run` refuses a run name whose topics already exist on the bus (a Kafka
broker outlives run directories): mixing two runs' records and offsets is never silent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from astraflow.core.bus import connect
from astraflow.core.topics import run_topics

ROOT = Path(__file__).resolve().parents[2]


def test_a_used_run_name_is_refused_with_a_way_out(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path}/shared.db"
    bus = connect(url)
    bus.create_topics(run_topics("quickstart", ["default"]))
    bus.close()
    r = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.app", "run", str(ROOT / "examples" /
                                                             "quickstart.yaml"),
         "--bus", url, "--out", str(tmp_path / "run"), "--no-live"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr + r.stdout
    assert "already has topics" in err and "--set run=NAME" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "logs").exists()  # no role was started
