"""The exit codes of `astraflow` (docs/cli.md): what a script running a command can branch
on. Usage errors (a bad option, a missing argument) are click's 2."""

from __future__ import annotations

OK = 0
#: a run or config error: the config fails its check, a file is missing, the warm-up missed
#: its band, a role's own error (its message says what to do)
ERROR = 1
#: a usage error (click's): an unknown option, a missing argument, a bad value
USAGE = 2
#: `astraflow run`: a role failed for good, having exhausted ``launch.max_restarts`` (or with
#: ``launch.restart: false``, died once); its log tail is printed and summary.json names it
ROLE_FAILED = 3


def run_code(failed: list[str]) -> int:
    """The code `astraflow run` ends with once its roles are stopped: ROLE_FAILED when any
    role failed for good, else OK (an interrupted run that stopped cleanly included)."""
    return ROLE_FAILED if failed else OK
