"""launch.stop_at_accuracy: the RL phase stops once every policy's evaluator has measured the
target, judged from real Metric records on an embedded bus."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import ExperimentConfig
from astraflow.core.bus import connect
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.topics import run_topics
from astraflow.run.collector import Collector
from astraflow.run.orchestrate import _reached


def config(**launch: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"run": "r", "policies": ["a", "b"],
                                            "launch": launch})


def test_stops_only_when_every_evaluator_reached_the_target(tmp_path: Path) -> None:
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["a", "b"]))
    col = Collector(bus, "r")
    ev = {p: MetricsEmitter(bus, run="r", role="evaluator", component=f"evaluator-{p}")
          for p in ("a", "b")}
    cfg = config(stop_at_accuracy=0.4)

    def measure(policy: str, step: int, acc: float) -> None:
        ev[policy].set("eval_step", step)
        ev[policy].set("eval_accuracy", acc)
        ev[policy].emit()
        col.poll(1.0)

    assert not _reached(cfg, col)  # nothing measured yet
    measure("a", 10, 0.45)
    assert not _reached(cfg, col)  # b has not been measured
    measure("b", 10, 0.39)
    assert not _reached(cfg, col)
    measure("b", 20, 0.40)
    assert _reached(cfg, col)
    assert not _reached(config(), col)  # no target: never
    col.close()
    bus.close()


def test_a_target_without_the_evaluator_is_refused() -> None:
    with pytest.raises(Exception, match="stop_at_accuracy needs the evaluator"):
        config(stop_at_accuracy=0.5, evaluate=False)
    with pytest.raises(Exception, match="stop_at_accuracy"):
        config(stop_at_accuracy=1.5)


def test_the_warm_up_phase_drops_the_target() -> None:
    """The SFT warm-up runs without an evaluator, so it cannot carry the RL phase's target."""
    from astraflow.run.launch import warmup_config

    cfg = ExperimentConfig.model_validate({"launch": {"stop_at_accuracy": 0.4,
                                                      "warmup": {"steps": 10}}})
    warm = warmup_config(cfg)
    assert warm.launch.stop_at_accuracy is None and not warm.launch.evaluate
