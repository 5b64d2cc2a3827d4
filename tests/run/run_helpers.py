"""Checks shared by the end-to-end run tests: a run of `astraflow run` that finished, and its
trainer's rewards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def rl_rewards(out: Path) -> list[float]:
    """The mean train reward of every RL step, in step order (the trainer's own log; the SFT
    warm-up's steps, batches ``<policy>-sft-<n>``, are left out; a step written twice by a
    restarted trainer counts once)."""
    by_step: dict[int, float] = {}
    for line in (out / "trainer-default.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "reward_mean" in row and "-sft-" not in row["batch_id"]:
            by_step[int(row["step"])] = float(row["reward_mean"])
    return [by_step[k] for k in sorted(by_step)]
