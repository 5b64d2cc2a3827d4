"""A gang of N rank processes that live and die together: a multi-rank trainer as one role.

    python -m astraflow.core.gang 2 -- python -m astraflow.cli.app train CONFIG ...

starts the command N times with the environment torchrun gives its workers (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` on a
free loopback port), so ``torch.distributed`` / ``accelerate`` set up one process group.

Why not torchrun: its workers run in sessions of their own, so a SIGKILL of torchrun (what a
launcher does to a role that does not stop) leaves them running, blocked in collectives. Here
the ranks stay in the gang's process group, so :class:`~astraflow.core.launcher.Child`'s
signal to the group reaches every rank, and the gang watches them: when any rank exits with
a non-zero code or a signal (an OOM kill, ``kill -9`` of one rank), the others are SIGKILLed
— they cannot finish a collective without it, and anything they did since the last
checkpoint is trained again from it — and the gang exits 1, for its launcher to restart the
whole gang. SIGTERM (or SIGINT) to the gang is passed to every rank (each stops at a step
boundary, rank 0 checkpoints with the others joining); the gang exits 0 once all exit 0.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from astraflow.core.launcher import LAUNCHER_PID_ENV, stop_when_orphaned
from astraflow.core.ports import free_port

log = logging.getLogger("astraflow.gang")


def gang_argv(ranks: int, argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` as a gang of ``ranks`` processes."""
    return [sys.executable, "-m", "astraflow.core.gang", str(ranks), "--", *argv]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), LAUNCHER_PID_ENV: str(os.getpid())}


def run(world: int, argv: Sequence[str], poll_s: float = 0.1) -> int:
    """Run the gang until every rank exits 0 (returns 0) or one fails (returns 1)."""
    stop_when_orphaned()  # before the ranks copy the environment
    port = free_port()
    procs = [subprocess.Popen(list(argv), env={**os.environ, **rank_env(r, world, port)},
                              stdin=subprocess.DEVNULL) for r in range(world)]

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            log.error("rank %d of %d exited with %s: stopping the other ranks (SIGKILL); the "
                      "gang restarts as a whole from the last checkpoint", rank, world, code)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(poll_s)


def main(args: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if args is None else args)
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit() or int(args[0]) < 1:
        sys.exit("usage: python -m astraflow.core.gang N -- COMMAND [ARGS...]")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(run(int(args[0]), args[2:]))


if __name__ == "__main__":
    main()
