"""`astraflow serve` starts the run's bus when its run directory has none (the gateway is
where an agent's data enters a run; the trainer's roles join it after), and joins it
otherwise. The whole command, serving the tiny model on a bus it started:
tests/gateway/test_gateway_durability.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.cli.serve import new_bus
from astraflow.config import ExperimentConfig
from astraflow.core.bus import connect


def test_serve_starts_the_bus_of_a_run_directory_without_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ExperimentConfig.model_validate({"run": "agent", "bus": {"url": "embedded://{out}/bus.db"}})
    out = tmp_path / "runs" / "agent"
    assert new_bus(cfg, out) == out
    assert out.is_dir()
    said = capsys.readouterr().err
    assert "starting the run's bus" in said and "astraflow train CONFIG" in said
    connect(f"embedded://{out}/bus.db").close()  # what the gateway then opens
    assert new_bus(cfg, out) == out
    assert capsys.readouterr().err == ""  # a run's bus: joined, nothing said


def test_serve_on_kafka_says_nothing_of_a_bus(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ExperimentConfig.model_validate({"run": "agent",
                                           "bus": {"url": "kafka://127.0.0.1:9092"}})
    assert new_bus(cfg, tmp_path / "run") == tmp_path / "run"
    assert capsys.readouterr().err == ""
