"""tests/hangwatch.py: a test stuck where pytest-timeout's signal cannot reach it ends with its
stacks on file, and under pytest-xdist the run goes on to the next test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STUCK = '''
import signal, time
import pytest

@pytest.mark.timeout(1)
def test_stuck():
    # pytest-timeout's SIGALRM blocked: as good as a wait inside C code
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)

def test_after():
    assert True
'''


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_stuck_here.py").write_text(STUCK)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent),
           "ASTRAFLOW_TEST_HANG_DIR": str(tmp_path / "hangs"),
           "ASTRAFLOW_TEST_HANG_GRACE_S": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hangwatch", "-p", "no:cacheprovider",
         "test_stuck_here.py", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50)


def _hang_reports(tmp_path: Path) -> list[str]:
    texts = [f.read_text() for f in sorted((tmp_path / "hangs").glob("hang-*.txt"))]
    return [t for t in texts if t]


def test_a_stuck_test_ends_with_its_stacks_on_file(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "-p", "no:xdist")
    assert run.returncode != 0
    [report] = _hang_reports(tmp_path)
    assert not any(f.read_text() for f in (tmp_path / "hangs").glob("stacks-*.txt"))
    assert report.startswith("test_stuck_here.py::test_stuck, begun at ")
    assert "which exits 2 s after the test began" in report.splitlines()[0]
    assert "in test_stuck" in report


@pytest.mark.slow  # 9-35 s here: out of the unit part (scripts/test.sh unit)
def test_under_xdist_the_run_goes_on_after_a_stuck_test(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "-n", "1")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "crashed while running" in out and "test_stuck" in out, out
    assert "1 passed" in out, out
    assert len(_hang_reports(tmp_path)) == 1


def test_a_test_that_ends_leaves_no_report(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "-p", "no:xdist", "-k", "after", "--timeout", "30")
    assert run.returncode == 0, run.stdout
    assert (tmp_path / "hangs").is_dir() and _hang_reports(tmp_path) == []


def test_sigusr1_writes_the_stacks_and_the_run_goes_on(tmp_path: Path) -> None:
    """What scripts/test.sh's bound on a part sends before it kills: each test process
    writes its stacks and carries on."""
    (tmp_path / "test_slow_here.py").write_text(
        "import time\n\ndef test_slow():\n    time.sleep(3)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent),
           "ASTRAFLOW_TEST_HANG_DIR": str(tmp_path / "hangs")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "hangwatch", "-p", "no:cacheprovider",
         "-p", "no:xdist", "--timeout", "60", "test_slow_here.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(f.read_text() for f in (tmp_path / "hangs").glob("hang-*.txt")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)  # the test has begun once its header is written
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    [stacks] = [f.read_text() for f in (tmp_path / "hangs").glob("stacks-*.txt")]
    assert "in test_slow" in stacks
    assert _hang_reports(tmp_path) == []  # the test ended: nothing hung
