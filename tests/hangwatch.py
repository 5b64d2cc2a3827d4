"""A second, harder limit behind pytest-timeout's, for the CI run (scripts/test.sh).

pytest-timeout's ``signal`` method cannot end a wait inside C code that never returns to
the interpreter (a librdkafka call, say), nor a cleanup that blocks after its signal has
fired. faulthandler's watchdog thread can: a test whose setup, call and teardown together
run ``grace`` seconds past its pytest-timeout limit gets the stacks of every thread of its
process written to a file in ``$ASTRAFLOW_TEST_HANG_DIR``, and the process exits. Under
pytest-xdist the worker is reported crashed and replaced, and the run goes on; scripts/test.sh
prints the files after each part, so a hang reads as a failure with its stacks instead of a
CI run that never ends.

Off where ``ASTRAFLOW_TEST_HANG_DIR`` is unset (a developer's plain pytest run). tests/conftest.py
loads it; ``ASTRAFLOW_TEST_HANG_GRACE_S`` sets the grace (default 120 s).
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Generator
from pathlib import Path
from typing import IO

import pytest

HANG_DIR_ENV = "ASTRAFLOW_TEST_HANG_DIR"
HANG_GRACE_ENV = "ASTRAFLOW_TEST_HANG_GRACE_S"
DEFAULT_GRACE_S = 120.0

_file: IO[str] | None = None


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
    global _file
    folder, limit = os.environ.get(HANG_DIR_ENV), timeout_of(item)
    if not folder or limit <= 0:
        yield
        return
    grace = float(os.environ.get(HANG_GRACE_ENV) or DEFAULT_GRACE_S)
    if _file is None:  # one file per test process, kept open: the watchdog writes to its fd
        Path(folder).mkdir(parents=True, exist_ok=True)
        _file = open(Path(folder) / f"hang-{os.getpid()}.txt", "w")  # noqa: SIM115
    _reset(_file)
    _file.write(f"{item.nodeid} had not ended {limit + grace:.0f} s after it began "
                f"(pytest-timeout: {limit:.0f} s). The stacks of its test process "
                f"(pid {os.getpid()}), which then exited:\n")
    _file.flush()
    faulthandler.dump_traceback_later(limit + grace, exit=True, file=_file)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        _reset(_file)  # an empty file: nothing hung
