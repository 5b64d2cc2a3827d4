"""Train–inference mismatch through `astraflow run` (docs/trainer.md#train-inference-mismatch):
a rollout engine that runs the model in bfloat16 while the trainer runs it in float32 raises
the alarm on the first step, and with ``trainer.mismatch.on_breach: stop`` training ends
there, checkpointed, the run's accounting whole. The clean side (float32 on both: no alarm in
a whole run) is checked on the quickstart's runs (test_quickstart_e2e.check_run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import check_finished, run_astraflow
from test_quickstart_e2e import QUICKSTART


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_engine_in_another_dtype_raises_the_alarm_and_stops_training(
        tmp_path: Path, quickstart_warm: Path) -> None:
    out = tmp_path / "run"
    sets = [f"models.default.path={quickstart_warm}", "models.default.build=none",
            "launch.warmup.steps=0", "launch.evaluate=false", "trainer.max_steps=20",
            "rollout.engine.dtype=bfloat16", "trainer.mismatch.max_k3=1.0e-6",
            "trainer.mismatch.on_breach=stop", "trainer.checkpoint_every=50",
            "launch.timeout_s=300"]
    rc, output = run_astraflow(["run", str(QUICKSTART), "--out", str(out), "--no-live",
                                *[a for s in sets for a in ("--set", s)]], out, timeout=500)
    # version 0 is what the worker samples first: the first step's tokens are all fresh
    summary = check_finished(out, rc, output, steps=1, per_step=64 * 8)
    rows = [json.loads(x) for x in (out / "trainer-default.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if "loss" in r]
    assert step["mismatch_alarm"] == 1.0 and step["mismatch_tokens_fresh"] > 0, step
    assert step["mismatch_k3_fresh"] > 1e-6 and step["mismatch_abs_max_fresh"] > 1e-3, step
    (stop,) = [r for r in rows if r.get("event") == "stop"]
    assert stop["reason"] == "mismatch" and stop["version"] == 1, stop
    log = (out / "logs" / "trainer-default.log").read_text()
    assert "train-inference mismatch at step 1 (default): k3" in log, log[-3000:]
    assert "training ends after step 1" in log
    assert (out / "checkpoints" / "trainer-default" / f"step-{1:010d}").is_dir()
    assert summary["roles"]["trainer-default"]["restarts"] == 0
