"""Fixtures of the end-to-end run tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_helpers import run_astraflow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def quickstart_warmup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of `astraflow run examples/quickstart.yaml --warmup-only` (its SFT
    warm-up to its band, ~50 s on 2 cores, and no RL). Run once per session:
    test_quickstart_e2e checks its warm-up and starts RL from it with ``--warm``; other tests
    that start RL from a warm model use :func:`quickstart_warm`."""
    out = tmp_path_factory.mktemp("quickstart-warm") / "run"
    rc, output = run_astraflow(
        ["run", str(ROOT / "examples" / "quickstart.yaml"), "--out", str(out), "--no-live",
         "--warmup-only"], out, timeout=900)
    assert rc == 0, output[-4000:]
    assert (out / "models" / "default-warm" / "config.json").exists(), output[-4000:]
    assert f"astraflow run CONFIG --warm {out}" in " ".join(output.split()), output
    return out


@pytest.fixture(scope="session")
def quickstart_warm(quickstart_warmup: Path) -> Path:
    """The quickstart's warm model (:func:`quickstart_warmup`), for the tests that start RL
    from a warm model (``models.<policy>.path=...``, ``models.<policy>.build=none``,
    ``launch.warmup.steps=0``)."""
    return quickstart_warmup / "models" / "default-warm"
