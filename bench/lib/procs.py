"""Whether a process still runs, seen from outside it: the chaos injector's view of a run's
roles and the tests' (``tests/waiting.py`` re-exports :func:`alive`). Standard library only."""

from __future__ import annotations

import os
from pathlib import Path


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
