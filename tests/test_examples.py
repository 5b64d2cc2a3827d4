"""Every shipped example config parses; config errors are reported all at once; the generated
configuration reference in docs/ is up to date."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.config import load_experiment

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def astraflow(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "astraflow.cli.app", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    cfg = load_experiment(path)
    assert cfg.run and cfg.policies


def test_examples_exist() -> None:
    assert any(p.name == "quickstart.yaml" for p in EXAMPLES)


def test_three_mistakes_are_reported_together(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: quickstart\n"
                   "trainer:\n  optimizer: {lr: -1}\n  loss: {aggregation: token-sum}\n"
                   "rollout:\n  engine: {temprature: 0.7}\n")
    r = astraflow("config", "show", str(bad))
    assert r.returncode == 1
    err = r.stderr
    assert "3 configuration problem(s)" in err, err
    assert "trainer.optimizer.lr" in err
    assert "trainer.loss.aggregation" in err and "token-mean" in err
    assert "rollout.engine.temprature: unknown key" in err and "temperature" in err
    assert "Traceback" not in err


def test_config_show_prints_the_resolved_config_with_overrides() -> None:
    r = astraflow("config", "show", str(ROOT / "examples" / "quickstart.yaml"),
                  "--set", "trainer.max_steps=7")
    assert r.returncode == 0, r.stderr
    shown = r.stdout
    assert "max_steps: 7" in shown and "rollout_workers: 1" in shown


