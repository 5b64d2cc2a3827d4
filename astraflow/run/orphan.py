"""A role of `astraflow run` stops once its launcher is gone.

The launcher starts each role in a session of its own (so that a role's SIGINT/SIGTERM and
its process group are its own) and stops every role when it is interrupted. Killed with
SIGKILL (an OOM kill, ``kill -9``, a test that gave up), it can stop nothing: its roles would
run on with no supervisor, holding cores, GPUs and group memberships. So the launcher names
itself in ``ASTRAFLOW_LAUNCHER_PID``, and a role started with it watches its parent: once the
parent is no longer the launcher, the role sends itself SIGTERM, and its own graceful stop
runs (a rollout worker finishes or releases its episodes and commits, a trainer stops at a
step boundary; a role without a handler just ends).

Roles started by hand (``astraflow rollout CONFIG`` from another terminal) have no such
variable and are left alone; the variable is taken out of the role's environment, so the
processes a role starts itself do not watch the launcher.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

LAUNCHER_PID_ENV = "ASTRAFLOW_LAUNCHER_PID"
POLL_S = 1.0

log = logging.getLogger("astraflow.run")


def launcher_env() -> dict[str, str]:
    """What the launcher adds to its roles' environment."""
    return {LAUNCHER_PID_ENV: str(os.getpid())}


def stop_when_orphaned(poll_s: float = POLL_S) -> threading.Thread | None:
    """In a role started by the launcher: a daemon thread that sends this process SIGTERM once
    its parent is not the launcher any more. None where there is nothing to watch."""
    raw = os.environ.pop(LAUNCHER_PID_ENV, None)
    if not raw:
        return None
    try:
        launcher = int(raw)
    except ValueError:
        log.warning("%s=%r is not a process id; not watching the launcher", LAUNCHER_PID_ENV,
                    raw)
        return None
    if os.getppid() != launcher:  # the launcher died while this role started (the variable is
        _stop(launcher)           # set by the launcher alone, for its own children)
        return None

    def watch() -> None:
        stopped = threading.Event()
        while not stopped.wait(poll_s):
            if os.getppid() != launcher:
                _stop(launcher)
                return

    thread = threading.Thread(target=watch, name="launcher-watch", daemon=True)
    thread.start()
    return thread


def _stop(launcher: int) -> None:
    log.warning("the launcher of this role (astraflow run, pid %d) is gone: stopping "
                "(SIGTERM to this process)", launcher)
    os.kill(os.getpid(), signal.SIGTERM)
