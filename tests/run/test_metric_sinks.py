"""metrics.sinks: the collector's lines reach TensorBoard and wandb, read back with their own
readers (TensorBoard's EventAccumulator; the offline wandb run's log via wandb's protobuf),
per role and per policy, with the run's name and config; a missing package names its extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from astraflow.core.bus import connect
from astraflow.core.errors import ConfigError
from astraflow.core.metrics import MetricsEmitter, component_id
from astraflow.core.topics import run_topics
from astraflow.run.collector import Collector
from astraflow.run.sinks import build_sinks, check_sinks, scalars

CONFIG = {"run": "sinky", "policies": ["solver", "verifier"], "trainer": {"max_steps": 3}}


def collect(tmp_path: Path, sinks: list) -> None:
    """Three trainer steps of two policies, their evaluations and the rollout summary."""
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("sinky", ["solver", "verifier"]))
    col = Collector(bus, "sinky", jsonl=tmp_path / "metrics.jsonl",
                    policies=["solver", "verifier"], sinks=sinks)
    trainers = {p: MetricsEmitter(bus, run="sinky", role="trainer",
                                  component=component_id(f"trainer-{p}")) for p in ("solver", "verifier")}
    evaluator = MetricsEmitter(bus, run="sinky", role="evaluator",
                               component=component_id("evaluator-solver"))
    rollout = MetricsEmitter(bus, run="sinky", role="rollout", component=component_id("rollout"))
    for step in range(1, 4):
        for i, t in enumerate(trainers.values()):
            t.set("step", step)
            t.set("reward_mean", step / 10 + i)
            t.set("wait_ratio", 0.25)
            t.emit()
        evaluator.set("eval_step", step)
        evaluator.set("eval_accuracy", step / 4)
        evaluator.emit()
        rollout.set("inflight", 4)
        rollout.inc("episodes", 8)
        rollout.emit()
        col.poll(1.0)
        col.write_summary({"tasks→rollout": 7})
    col.close()
    bus.close()


def test_tensorboard_and_wandb_get_every_line(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.run.wandb_log import history, run_info

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    options = type("M", (), {"tensorboard_dir": "{out}/tb", "wandb_project": "t",
                             "wandb_mode": "offline"})()
    sinks = build_sinks(["tensorboard", "wandb"], out=tmp_path, run="sinky", config=CONFIG,
                        options=options)
    tb, wb = sinks
    collect(tmp_path, sinks)

    acc = EventAccumulator(str(tmp_path / "tb" / "sinky"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"trainer/solver/reward_mean", "trainer/verifier/reward_mean",
            "trainer/solver/wait_ratio", "eval/solver/eval_accuracy",
            "rollout/episodes_per_s", "rollout/inflight", "lag/tasks_to_rollout"} <= tags, tags
    assert [(e.step, round(e.value, 3)) for e in acc.Scalars("trainer/verifier/reward_mean")] \
        == [(1, 1.1), (2, 1.2), (3, 1.3)]
    assert [e.step for e in acc.Scalars("eval/solver/eval_accuracy")] == [1, 2, 3]
    assert acc.Scalars("lag/tasks_to_rollout")[-1].value == 7
    assert "config" in acc.Tags()["tensors"]  # the run's config, as a text summary
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "max_steps: 3" in text

    log = next((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    name, config = run_info(log)
    assert name == "sinky" and config["trainer"] == {"max_steps": 3}
    rows = history(log)
    solver = [(r["step"], r["trainer/solver/reward_mean"]) for r in rows
              if "trainer/solver/reward_mean" in r]
    assert [(s, round(v, 3)) for s, v in solver] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert any(r.get("eval/solver/eval_accuracy") == 0.75 for r in rows)
    assert any(r.get("lag/tasks_to_rollout") == 7 for r in rows)
    assert wb.dir == log.parent and tb.logdir == tmp_path / "tb" / "sinky"


def test_a_missing_package_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for package in ("tensorboard", "wandb"):
        monkeypatch.setitem(sys.modules, package, None)  # import raises ImportError
        with pytest.raises(ConfigError) as e:
            check_sinks([package])
        assert f"pip install 'astraflow[{package}]'" in str(e.value)
    with pytest.raises(ConfigError, match="valid: tensorboard, wandb"):
        check_sinks(["mlflow"])


def test_scalars_name_role_and_policy() -> None:
    assert scalars({"time": 1.0, "elapsed": 0.1, "source": "trainer-a", "step": 4,
                    "policy": "p", "loss": 0.5, "note": "x"}) == (4, {"trainer/p/loss": 0.5})
    step, values = scalars({"source": "evaluator-team", "step": 2, "policy": "team",
                            "kind": "system", "system_accuracy": 0.5,
                            "versions": {"solver": 2, "verifier": 1}})
    assert (step, values) == (2, {"eval/team/system_accuracy": 0.5,
                                  "eval/team/versions.solver": 2.0,
                                  "eval/team/versions.verifier": 1.0})


def test_the_config_section_validates() -> None:
    from astraflow.config import ExperimentConfig

    cfg = ExperimentConfig.model_validate({"metrics": {"sinks": ["tensorboard"]}})
    assert cfg.metrics.sinks == ["tensorboard"]
    with pytest.raises(Exception, match="tensorboard"):
        ExperimentConfig.model_validate({"metrics": {"sinks": ["mlflow"]}})
