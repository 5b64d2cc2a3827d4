"""Waiting in tests, one way: poll a condition until it holds or a deadline passes.

    from waiting import eventually, wait_for
    wait_for(lambda: log.exists(), 30, "the log")            # AssertionError naming it
    assert eventually(lambda: proc.poll() is not None, 10)   # a bool, for the test to judge
    assert eventually(lambda: not alive(pid), 30)            # a killed process is gone
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from bench.lib.procs import alive

__all__ = ["alive", "eventually", "wait_for"]  # alive: bench/lib/procs.py, shared with bench

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
