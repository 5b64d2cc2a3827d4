"""Which steps a replay takes from a trainer's JSON log (astraflow.run.replay.trained_steps):
the RL phase after a warm-up's SFT steps, the last line of a step a resumed trainer redid,
and clear errors for a missing step or a warm-up-only log."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonl_files import write_jsonl

from astraflow.run.replay import ReplayError, trained_steps

TOPIC = "af.r.batches.default"


def line(step: int, batch: str, offset: int) -> dict:
    return {"step": step, "batch_id": batch, "origin": f"{TOPIC}[0]@{offset}", "loss": 0.1}


def test_the_rl_phase_after_a_warm_up_and_a_resume(tmp_path: Path) -> None:
    rows = [{"event": "start", "version": 0, "resumed": False},
            *[line(k, f"default-sft-{k}", 100 + k) for k in range(1, 6)],  # the warm-up
            {"event": "start", "version": 0, "resumed": False},  # RL from the warm model
            line(1, "default-0", 0), line(2, "default-1", 1), line(3, "default-2", 2),
            {"event": "start", "version": 2, "resumed": True},  # killed after 3, resumed at 2
            line(3, "default-2", 2), line(4, "default-3", 3)]
    steps = trained_steps(write_jsonl(tmp_path / "t.jsonl", rows))
    assert [(s.version, s.batch_id, s.topic, s.partition, s.offset) for s in steps] == [
        (1, "default-0", TOPIC, 0, 0), (2, "default-1", TOPIC, 0, 1),
        (3, "default-2", TOPIC, 0, 2), (4, "default-3", TOPIC, 0, 3)]


def test_a_missing_step_and_a_warm_up_only_log_are_refused(tmp_path: Path) -> None:
    gap = [{"event": "start", "version": 0, "resumed": False}, line(1, "b0", 0), line(3, "b2", 2)]
    with pytest.raises(ReplayError, match="step 2 is not logged"):
        trained_steps(write_jsonl(tmp_path / "gap.jsonl", gap))
    sft = [{"event": "start", "version": 0, "resumed": False}, line(1, "default-sft-1", 0)]
    with pytest.raises(ReplayError, match="SFT warm-up"):
        trained_steps(write_jsonl(tmp_path / "sft.jsonl", sft))
    with pytest.raises(ReplayError, match="no such trainer log"):
        trained_steps(tmp_path / "absent.jsonl")
