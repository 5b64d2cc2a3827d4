"""A gang of N rank processes that live and die together: a multi-rank trainer as one role.

    python -m astraflow.core.gang 2 -- python -m astraflow.cli.app train CONFIG ...

starts the command N times with torchrun's environment (``RANK``, ``WORLD_SIZE``, ...) and
hosts the ranks' rendezvous store itself. Unlike torchrun, the ranks stay in the gang's
process group, so a launcher's signal reaches them all. When any rank fails the others are
killed and the gang exits 1, to be restarted whole; SIGTERM is passed to every rank and the
gang exits 0 once all do."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from astraflow.core.launcher import LAUNCHER_PID_ENV, stop_when_orphaned

log = logging.getLogger("astraflow.gang")


def gang_argv(ranks: int, argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` as a gang of ``ranks`` processes."""
    return [sys.executable, "-m", "astraflow.core.gang", str(ranks), "--", *argv]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """A rank's environment: torchrun's variables, the store at ``port`` hosted by the gang."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
            LAUNCHER_PID_ENV: str(os.getpid())}


def host_store(world: int) -> Any:
    """The ranks' rendezvous store, served by this process on a port the OS picks (bound at
    once: no other process can take it between choosing and binding)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                    timeout=timedelta(minutes=30))


def run(world: int, argv: Sequence[str], poll_s: float = 0.1) -> int:
    """Run the gang until every rank exits 0 (returns 0) or one fails (returns 1)."""
    stop_when_orphaned()  # before the ranks copy the environment
    store = host_store(world)  # held until the ranks are done
    port = store.port
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
