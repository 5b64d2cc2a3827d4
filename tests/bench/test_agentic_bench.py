"""bench/agentic.py's summary of accuracy per trainer step over repeated runs (what says
whether the pipeline learns as much per step as the synchronous loop), on made-up results:
the grid of evaluated steps, runs too short for it left out of the per-step means but not of
the times, the difference to the loop with its standard error, and ``--from`` pooling the
arms of several result files (``FILE:ARM`` taking only the named ones)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import agentic


def run(accs: dict[int, float], *, time: float | None, s_step: float,
        rewards: list[float], pipeline: bool) -> dict[str, Any]:
    rows = [{"step": i + 1, "reward_mean": r} for i, r in enumerate(rewards)]
    return {"curve": [{"step": 0, "accuracy": 0.2}, *({"step": s, "accuracy": a}
                                                      for s, a in sorted(accs.items()))],
            "time_to_target_s": time, "s_per_iter": s_step,
            "rows": {"default": rows} if pipeline else rows}


def by_arm(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["arm"]: r for r in rows}


def test_per_step_means_and_the_difference_to_the_loop() -> None:
    # evaluations at 10 and 20 (the grid up to 20); the pipeline evaluates every 10, the loop
    # every 5 (its step-15 point is off the grid)
    runs = [
        ("pipeline-40-r1", run({10: 0.3, 20: 0.5, 30: 0.6}, time=50.0, s_step=1.0,
                              rewards=[0.1] * 20, pipeline=True)),
        ("pipeline-40-r2", run({10: 0.4, 20: 0.6}, time=70.0, s_step=1.2,
                              rewards=[0.3] * 20, pipeline=True)),
        ("sync-40-r1", run({5: 0.9, 10: 0.4, 15: 0.9, 20: 0.6}, time=200.0, s_step=5.0,
                          rewards=[0.2] * 20, pipeline=False)),
        ("sync-40-r2", run({5: 0.9, 10: 0.5, 15: 0.9, 20: 0.7}, time=None, s_step=5.0,
                          rewards=[0.4] * 20, pipeline=False)),
        # too short for the grid: its time counts, its accuracy does not
        ("sync-40-r3", run({5: 0.9, 10: 0.9}, time=None, s_step=4.0, rewards=[0.9] * 10,
                          pipeline=False)),
        # the loop trained on older batches (--sync-delay): compared with the loop too
        ("delayed2-40", run({10: 0.35, 20: 0.55}, time=250.0, s_step=5.0,
                            rewards=[0.2] * 20, pipeline=False)),
    ]
    table, rows = agentic.per_step(runs, target=0.5, until=20)
    arms = by_arm(rows)
    p, s = arms["pipeline-40"], arms["sync-40"]
    assert p["acc_runs"] == pytest.approx([0.4, 0.5]) and p["runs"] == 2
    assert s["acc_runs"] == pytest.approx([0.5, 0.6]) and s["runs"] == 2
    assert p["acc_diff"] == pytest.approx(-0.1)
    # the standard errors of the two means (0.05 each) added in quadrature
    assert p["acc_diff_se"] == pytest.approx((0.05 ** 2 * 2) ** 0.5)
    assert p["reward"] == pytest.approx(0.2) and s["reward"] == pytest.approx(0.3)
    assert p["time"] == 60.0 and s["time"] == 200.0 and s["reached"] == "1/3"
    assert p["time_ratio"] == pytest.approx(200.0 / 60.0)
    # the first evaluation at or above 0.5, on the grid or off it
    assert p["steps"] == 20 and s["steps"] == 5
    assert "steps 10–20" in table and "| pipeline-40 | 2 (2) |" in table
    assert "| sync-40 | 3 (2) |" in table
    d = arms["delayed2-40"]
    assert d["acc_diff"] == pytest.approx(-0.1) and d["acc_diff_se"] is None  # one run
    assert d["time_ratio"] == pytest.approx(200.0 / 250.0)


def test_from_pools_result_files_and_takes_only_named_arms(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = {"target": 0.5, "results": {
        "pipeline-40": run({10: 0.4}, time=50.0, s_step=1.0, rewards=[0.1] * 10,
                           pipeline=True),
        "sync-40": run({10: 0.9}, time=10.0, s_step=5.0, rewards=[0.1] * 10, pipeline=False)}}
    two = {"target": 0.5, "results": {
        "sync-40": run({10: 0.5}, time=100.0, s_step=5.0, rewards=[0.1] * 10,
                       pipeline=False)}}
    (tmp_path / "one.json").write_text(json.dumps(one))
    (tmp_path / "two.json").write_text(json.dumps(two))
    assert agentic.main_from([f"{tmp_path / 'one.json'}:pipeline-40",
                              str(tmp_path / "two.json")], until=10) == 0
    out = capsys.readouterr().out
    # one.json's sync arm (0.9) was left out: the difference is 0.4 - 0.5
    assert "| pipeline-40 | 1 (1) |" in out and "| sync-40 | 1 (1) |" in out
    assert "-0.100" in out and "| 2.00 |" in out
