"""Waiting in tests, one way: poll a condition until it holds or a deadline passes.

    from waiting import eventually, wait_for
    wait_for(lambda: log.exists(), 30, "the log")            # AssertionError naming it
    assert eventually(lambda: proc.poll() is not None, 10)   # a bool, for the test to judge
    assert eventually(lambda: not alive(pid), 30)            # a killed process is gone
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(cond: Callable[[], T], timeout: float = 30.0,
             what: str | Callable[[], str] = "condition", *, every: float = 0.05,
             tick: Callable[[], object] | None = None) -> T:
    """Poll ``cond`` every ``every`` seconds until it is truthy and return its value; after
    ``timeout`` seconds, AssertionError naming ``what`` (a string, or a function that says
    what was seen). ``tick`` runs before each poll in place of the sleep (e.g. a consumer's
    own ``poll`` with its timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout} s waiting for {said}")
        if tick is None:
            time.sleep(every)


def eventually(cond: Callable[[], Any], timeout: float, every: float = 0.02) -> bool:
    """Whether ``cond`` became truthy within ``timeout`` seconds (polled every ``every``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return bool(cond())


def alive(pid: int) -> bool:
    """Whether process `pid` still runs: a zombie (ended, not yet reaped by its parent) is
    not. A SIGKILLed process still runs for a moment while the kernel tears it down, so a
    test that kills one waits with `eventually(lambda: not alive(pid), ...)`."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    except PermissionError:  # someone else's process under a reused pid: not ours, gone
        return False
    return state not in ("Z", "X")
