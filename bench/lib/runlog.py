"""Reading what a run left in its directory: a JSON-lines log's rows, its summary.json, and
the trainer's mean train reward per RL step (bench/learning.py, the e2e tests through
tests/e2e/run_helpers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from astraflow.core.jsonl import log_rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The object rows of the JSON-lines file ``path`` as a list (none when it is not there;
    a blank line, or a last line cut short by a kill, skipped: :func:`log_rows`)."""
    return list(log_rows(path))


def read_summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json; empty when the run wrote none (it did not end)."""
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def train_rewards(run_dir: Path, policy: str = "default") -> list[float]:
    """The mean train reward of every RL step, in step order (the trainer's log; a step a
    restarted trainer wrote twice counts once; SFT warm-up steps, batches
    ``<policy>-sft-<n>``, left out)."""
    by_step: dict[int, float] = {}
    for row in log_rows(run_dir / f"trainer-{policy}.jsonl"):
        if "reward_mean" in row and "-sft-" not in str(row.get("batch_id", "")):
            by_step[int(row["step"])] = float(row["reward_mean"])
    return [by_step[k] for k in sorted(by_step)]
