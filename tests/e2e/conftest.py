"""Fixtures of the end-to-end run tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from run_helpers import run_astraflow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def quickstart_warmup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of `astraflow run examples/quickstart.yaml --warmup-only` (its SFT
    warm-up to its band, ~50 s on 2 cores, and no RL). Run once per session, and once for all
    the processes of a pytest-xdist session (scripts/test.sh): the first to need it builds it
    in their shared temporary directory under a file lock, the others wait and reuse it, so
    that the tests starting from it need not share one process. test_quickstart_e2e checks
    its warm-up and starts RL from it with ``--warm``; other tests that start RL from a warm
    model use :func:`quickstart_warm`."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = shared / "quickstart-warm" / "run"
    done = out.parent / "done"
    with FileLock(str(shared / "quickstart-warm.lock")):
        if not done.exists():
            shutil.rmtree(out.parent, ignore_errors=True)  # a failed try's leftovers
            out.parent.mkdir(parents=True)
            rc, output = run_astraflow(
                ["run", str(ROOT / "examples" / "quickstart.yaml"), "--out", str(out),
                 "--no-live", "--warmup-only"], out, timeout=900)
            assert rc == 0, output[-4000:]
            assert (out / "models" / "default-warm" / "config.json").exists(), output[-4000:]
            assert f"astraflow run CONFIG --warm {out}" in " ".join(output.split()), output
            done.write_text("ok")
    return out


@pytest.fixture(scope="session")
def quickstart_warm(quickstart_warmup: Path) -> Path:
    """The quickstart's warm model (:func:`quickstart_warmup`), for the tests that start RL
    from a warm model (``models.<policy>.path=...``, ``models.<policy>.build=none``,
    ``launch.warmup.steps=0``)."""
    return quickstart_warmup / "models" / "default-warm"
