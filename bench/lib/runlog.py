"""Reading what a run left in its directory: a JSON-lines log's rows, and the trainer's mean
train reward per RL step (bench/learning.py, the e2e tests through tests/e2e/run_helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of the JSON-lines file ``path``, blank lines skipped; none when it is not
    there."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_rewards(run_dir: Path, policy: str = "default") -> list[float]:
    """The mean train reward of every RL step, in step order (the trainer's log; a step a
    restarted trainer wrote twice counts once; SFT warm-up steps, batches
    ``<policy>-sft-<n>``, left out)."""
    by_step: dict[int, float] = {}
    for line in (run_dir / f"trainer-{policy}.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "reward_mean" in row and "-sft-" not in str(row.get("batch_id", "")):
            by_step[int(row["step"])] = float(row["reward_mean"])
    return [by_step[k] for k in sorted(by_step)]
