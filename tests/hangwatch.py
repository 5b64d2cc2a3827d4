"""A second, harder limit behind pytest-timeout's, for the CI run (scripts/test.sh).

pytest-timeout's ``signal`` method cannot end a wait inside C code that never returns to
the interpreter (a librdkafka call, say), nor a cleanup that blocks after its signal has
fired. faulthandler's watchdog thread can: a test whose setup, call and teardown together
run ``grace`` seconds past its pytest-timeout limit gets the stacks of every thread of its
process written to a file in ``$ASTRAFLOW_TEST_HANG_DIR``, and the process exits. Under
pytest-xdist the worker is reported crashed and replaced, and the run goes on; scripts/test.sh
prints the files after each part, so a hang reads as a failure with its stacks instead of a
CI run that never ends.

Each test process (pytest-xdist's controller too) also writes its stacks on SIGUSR1, to
``stacks-PID.txt`` there, and goes on: scripts/test.sh's wall-clock bound on each part sends
it before killing, so even a run stuck between tests says where.

Off where ``ASTRAFLOW_TEST_HANG_DIR`` is unset (a developer's plain pytest run). tests/conftest.py
loads it; ``ASTRAFLOW_TEST_HANG_GRACE_S`` sets the grace (default 120 s).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO

import pytest

HANG_DIR_ENV = "ASTRAFLOW_TEST_HANG_DIR"
HANG_GRACE_ENV = "ASTRAFLOW_TEST_HANG_GRACE_S"
DEFAULT_GRACE_S = 120.0

_file: IO[str] | None = None
_stacks: IO[str] | None = None


def _open() -> IO[str] | None:
    """This process's file for the running test (opened once and kept open, as is the one
    for SIGUSR1: faulthandler writes to their fds), None where the watch is off."""
    global _file, _stacks
    folder = os.environ.get(HANG_DIR_ENV)
    if _file is None and folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        _file = open(Path(folder) / f"hang-{os.getpid()}.txt", "w")  # noqa: SIM115
        _stacks = open(Path(folder) / f"stacks-{os.getpid()}.txt", "w")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)
    return _file


_open()  # at import: the SIGUSR1 dump covers the process before its first test


def timeout_of(item: pytest.Item) -> float:
    """The pytest-timeout limit of ``item`` in seconds (its marker's, else the session's)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return float(value or 0)


def _reset(file: IO[str]) -> None:
    file.seek(0)
    file.truncate()
    file.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    file, limit = _open(), timeout_of(item)
    if file is None or limit <= 0:
        yield
        return
    grace = float(os.environ.get(HANG_GRACE_ENV) or DEFAULT_GRACE_S)
    _reset(file)
    file.write(f"{item.nodeid}, begun at {time.strftime('%H:%M:%S')} in process {os.getpid()} "
               f"(pytest-timeout {limit:.0f} s), had not ended: the stacks of that process, "
               f"which exits {limit + grace:.0f} s after the test began:\n")
    file.flush()
    faulthandler.dump_traceback_later(limit + grace, exit=True, file=file)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        _reset(file)  # an empty file: nothing hung
