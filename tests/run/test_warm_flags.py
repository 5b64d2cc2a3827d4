"""`astraflow run --warm DIR` (RL from the models another run's warm-up left) and
`--warmup-only` (the warm-up alone): what they read, and what they refuse. The whole path, a
real warm-up and RL started from it, is tests/e2e/test_quickstart_e2e.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.config import load_experiment
from astraflow.core.errors import ConfigError
from astraflow.models.tiny import build_model, build_tokenizer, save
from astraflow.run.launch import RL_CONFIG
from astraflow.run.warmup import from_warm, start_models

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
TEAM = ROOT / "examples" / "solver_verifier.yaml"


def warm_run(tmp_path: Path, policies: dict[str, str | None]) -> Path:
    """A run directory as a warm-up leaves it: ``config-rl.yaml`` whose policy ``p`` starts
    from ``models/<p>-warm`` (saved: a tiny model) or, for ``None``, from the model as built
    (``models/<p>``, saved too)."""
    run = tmp_path / "warm"
    tok = build_tokenizer("arith")
    data = yaml.safe_load(QUICKSTART.read_text())
    data["policies"] = list(policies)
    data["models"] = {}
    for p, warm in policies.items():
        if warm is None:  # no warm-up of p: config-rl.yaml keeps the build, the model as built
            data["models"][p] = {"build": "tiny-arith", "seed": 0}
            save(build_model(tok, seed=0), tok, run / "models" / p)
        else:
            data["models"][p] = {"path": str(run / "models" / warm), "build": "none"}
            save(build_model(tok, seed=1), tok, run / "models" / warm)
    (run / RL_CONFIG).write_text(yaml.safe_dump(data))
    return run


def test_from_warm_starts_every_policy_from_the_runs_models(tmp_path: Path) -> None:
    run = warm_run(tmp_path, {"default": "default-warm"})
    cfg = from_warm(load_experiment(QUICKSTART), run)
    assert cfg.models["default"].path == str((run / "models" / "default-warm").resolve())
    assert cfg.models["default"].build == "none"
    assert cfg.launch.warmup.steps == 0  # no warm-up of its own
    # what the example sets otherwise is kept
    assert cfg.trainer == load_experiment(QUICKSTART).trainer


def test_a_policy_without_a_warm_up_starts_from_the_model_as_built(tmp_path: Path) -> None:
    run = warm_run(tmp_path, {"default": None})
    assert start_models(run) == {"default": (run / "models" / "default").resolve()}
    # gone, it is refused, not built anew in the other run's directory
    shutil.rmtree(run / "models" / "default")
    with pytest.raises(ConfigError, match="the model of policy 'default' is gone"):
        start_models(run)
    assert not (run / "models" / "default").exists()


def test_a_run_with_more_policies_serves_a_config_with_fewer(tmp_path: Path) -> None:
    """The solver of a solver + verifier warm-up, alone (examples/solver_alone.yaml)."""
    run = warm_run(tmp_path, {"solver": "solver-warm", "verifier": "verifier-warm"})
    cfg = from_warm(load_experiment(ROOT / "examples" / "solver_alone.yaml"), run)
    assert cfg.policies == ["solver"]
    assert cfg.models["solver"].path == str((run / "models" / "solver-warm").resolve())


def test_what_warm_refuses(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config-rl.yaml there.*--warmup-only"):
        start_models(tmp_path)
    run = warm_run(tmp_path, {"default": "default-warm"})
    with pytest.raises(ConfigError) as e:  # every policy it lacks, named
        from_warm(load_experiment(TEAM), run)
    assert e.value.problems == [
        f"--warm {run}: no model of policy {p!r} there (its policies: default)"
        for p in ("solver", "verifier")]
    (run / "models" / "default-warm" / "config.json").unlink()
    with pytest.raises(ConfigError, match="the model of policy 'default' is gone"):
        start_models(run)


def said(result: object) -> str:
    """The CLI's output with rich's line wrapping undone."""
    return " ".join(result.output.split())  # type: ignore[attr-defined]


def test_the_cli_refuses_bad_combinations(tmp_path: Path) -> None:
    run = warm_run(tmp_path, {"default": "default-warm"})
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--warm", str(run), "--warmup-only",
                                 "--out", str(tmp_path / "out"), "--no-live"])
    assert r.exit_code == 1 and "--warm and --warmup-only: give one" in said(r)
    # --fresh deletes the run directory first: the warm models must not lie in it
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--warm", str(run), "--out",
                                 str(tmp_path), "--no-live", "--fresh"])
    assert r.exit_code == 1 and "which --fresh deletes first" in said(r)
    assert (run / RL_CONFIG).exists()
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--warmup-only", "--set",
                                 "launch.warmup.steps=0", "--out", str(tmp_path / "out"),
                                 "--no-live"])
    assert r.exit_code == 1 and "no warm-up to run" in said(r)
    assert not (tmp_path / "out").exists()  # refused before anything was made
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--warm", str(tmp_path / "nope"),
                                 "--out", str(tmp_path / "out"), "--no-live"])
    assert r.exit_code == 1 and "no config-rl.yaml there" in said(r)
