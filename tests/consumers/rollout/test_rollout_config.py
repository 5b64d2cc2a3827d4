"""The rollout config section and the `astraflow rollout` command function."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.core.config import validate
from astraflow.core.errors import ConfigError


def test_defaults_and_unknown_keys() -> None:
    rc = ExperimentConfig().rollout
    assert rc.engine.type == "hf" and rc.max_concurrent_episodes == 32
    assert rc.weights.enabled and rc.reward.name == "exact_match"
    assert (rc.engine.temperature, rc.engine.max_new_tokens) == (1.0, 64)
    assert rc.workflow.default == "single_turn" and rc.group is None
    with pytest.raises(ConfigError, match=r"rollout.engine.tempreature: unknown key"):
        validate(ExperimentConfig, {"rollout": {"engine": {"tempreature": 1}}})
    with pytest.raises(ConfigError) as e:
        validate(ExperimentConfig, {"rollout": {"engine": {"type": "tgi"},
                                                "max_concurrent_episodes": 0}})
    assert len(e.value.problems) == 2  # every problem at once


def test_the_rollout_group_is_the_runs_unless_set() -> None:
    from astraflow.run.lag import lag_groups

    a, b = (ExperimentConfig.model_validate({"run": r}) for r in ("a", "b"))
    assert a.rollout.group_for(a.run) == "af.a.rollout" != b.rollout.group_for(b.run)
    assert lag_groups(a) == [("tasks→rollout", "af.a.rollout", "af.a.tasks")]
    c = ExperimentConfig.model_validate({"run": "c", "rollout": {"group": "shared"}})
    assert c.rollout.group_for(c.run) == "shared"
    assert lag_groups(c)[0][1] == "shared"  # the lag shown is the configured group's
    with pytest.raises(ConfigError, match=r"rollout.group: .*invalid consumer group name"):
        validate(ExperimentConfig, {"rollout": {"group": "no spaces"}})


def test_rollout_command_runs_a_worker(tmp_path: Path, arith_dir: Path,
                                       capsys: pytest.CaptureFixture[str],
                                       new_run: Any) -> None:
    from astraflow.cli.produce import produce
    from astraflow.cli.rollout import rollout

    path = tmp_path / "exp.yaml"
    path.write_text(
        f"run: c{uuid.uuid4().hex[:6]}\n"
        "bus: {url: 'embedded://{out}/bus.db'}\n"
        "producer: {topic: tasks, n_samples: 2, arithmetic: {count: 6}}\n"
        f"rollout: {{engine: {{model: '{arith_dir}', threads: 1, max_new_tokens: 4}}}}\n")
    cfg = load_experiment(path)
    assert cfg.rollout.engine.model == str(arith_dir)
    new_run(path, tmp_path)  # a role joins a run: its bus exists
    produce(config=path, out=tmp_path, overrides=None, max_tasks=None)
    rollout(config=path, out=tmp_path, overrides=["rollout.max_concurrent_episodes=4"],
            max_tasks=6, timeout=None, worker_id="cli-w")
    out = capsys.readouterr().out
    assert "tasks_done=6" in out and "episodes=12" in out and "trajectories=12" in out
