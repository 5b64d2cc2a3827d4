"""``launch.rollout_speeds``: `astraflow run` gives each rollout process its own
``rollout.engine.speed`` (heterogeneous workers, docs/rollout.md); one speed per worker, each in
(0, 1], else a config error naming the key; workers beyond the list run at the config's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.config import ExperimentConfig, load_experiment
from astraflow.core.config import validate
from astraflow.core.errors import ConfigError
from astraflow.run.launch import rl_roles, write_config


def rollout_roles(config: ExperimentConfig, tmp_path: Path) -> dict[str, list[str]]:
    """The `astraflow ...` arguments of each rollout role of the RL phase."""
    roles = rl_roles(config, tmp_path / "config.yaml", tmp_path / "run")
    cut = len(["python", "-m", "astraflow.cli.app"])
    return {r.name: r.argv[cut:] for r in roles if r.name.startswith("rollout-")}


def speeds_config(**launch: Any) -> ExperimentConfig:
    return validate(ExperimentConfig, {"launch": launch})


def test_each_rollout_process_gets_its_own_speed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 new_run: Any) -> None:
    config = speeds_config(rollout_workers=3, rollout_speeds=[1.0, 0.6, 0.3])
    path = write_config(config, tmp_path / "config.yaml")
    new_run(path, tmp_path / "run")  # the roles join the run's bus
    roles = rollout_roles(config, tmp_path)
    assert sorted(roles) == ["rollout-0", "rollout-1", "rollout-2"]

    # each role's argv, run through the real command line, reaches its worker's config
    seen: list[float] = []

    def fake_run_worker(cfg: ExperimentConfig, out: Any, **_: Any) -> Any:
        seen.append(cfg.rollout.engine.speed)
        from astraflow.consumers.rollout.worker import WorkerStats

        return WorkerStats()

    monkeypatch.setattr("astraflow.run.roles.run_configured_worker", fake_run_worker)
    runner = CliRunner()
    for name in ("rollout-0", "rollout-1", "rollout-2"):
        assert roles[name][:2] == ["rollout", str(path)]
        result = runner.invoke(app, roles[name])
        assert result.exit_code == 0, result.output
    assert seen == [1.0, 0.6, 0.3]


def test_without_speeds_every_worker_runs_at_the_configs_speed(tmp_path: Path) -> None:
    config = validate(ExperimentConfig, {"launch": {"rollout_workers": 2},
                                         "rollout": {"engine": {"speed": 0.5}}})
    roles = rollout_roles(config, tmp_path)
    assert all("--set" not in argv for argv in roles.values()) and len(roles) == 2
    assert config.launch.rollout_speed(0) is None


def test_a_standalone_worker_takes_its_speed_from_set() -> None:
    config = load_experiment(None, ["rollout.engine.speed=0.3"])
    assert config.rollout.engine.speed == 0.3


def test_workers_the_pool_bounds_add_run_at_the_configs_speed(tmp_path: Path) -> None:
    config = validate(ExperimentConfig, {
        "launch": {"rollout_workers": 2, "rollout_speeds": [0.5, 0.25]},
        "scale": {"enabled": True, "pools": {"rollout": {"min_workers": 3,
                                                         "max_workers": 4}}}})
    roles = rollout_roles(config, tmp_path)
    assert roles["rollout-0"][-2:] == ["--set", "rollout.engine.speed=0.5"]
    assert roles["rollout-1"][-2:] == ["--set", "rollout.engine.speed=0.25"]
    assert "--set" not in roles["rollout-2"]  # the pool's minimum, beyond the list


@pytest.mark.parametrize(("launch", "message"), [
    ({"rollout_workers": 3, "rollout_speeds": [1.0, 0.5]},
     r"launch\.rollout_speeds: .*2 speed\(s\) for launch\.rollout_workers = 3"),
    ({"rollout_workers": 2, "rollout_speeds": [1.0, 1.5]},
     r"launch\.rollout_speeds: .*\[1\] = 1\.5 is not in \(0, 1\]"),
    ({"rollout_workers": 2, "rollout_speeds": [0.0, 0.5]},
     r"launch\.rollout_speeds: .*\[0\] = 0\.0 is not in \(0, 1\]"),
    ({"rollout_workers": 1, "rollout_speeds": ["fast"]}, r"launch\.rollout_speeds\.0"),
])
def test_bad_speeds_are_config_errors_naming_the_key(launch: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(ExperimentConfig, {"launch": launch})


def test_a_worker_count_set_on_the_command_line_must_match_the_speeds(tmp_path: Path) -> None:
    config = speeds_config(rollout_workers=2, rollout_speeds=[1.0, 0.5])
    path = write_config(config, tmp_path / "config.yaml")
    assert load_experiment(path).launch.rollout_speeds == [1.0, 0.5]
    with pytest.raises(ConfigError, match=r"launch\.rollout_speeds"):
        load_experiment(path, ["launch.rollout_workers=3"])
    both = load_experiment(path, ["launch.rollout_workers=3",
                                  "launch.rollout_speeds=[1.0, 0.6, 0.3]"])
    assert [both.launch.rollout_speed(i) for i in range(4)] == [1.0, 0.6, 0.3, None]
