"""A test's rank processes forked from one preloaded interpreter: astraflow's own fork server
(astraflow.core.forkserver, the one `astraflow run` forks its torch roles from), one per test
process, instead of a fresh interpreter per rank under torchrun. Each fresh process imported
torch and transformers again (~7 CPU-s here, the most of a tiny model's test); a forked one
starts with them imported.

The ranks get what the gang of `astraflow run` gives its ranks (astraflow.core.gang: torchrun's
variables, the rendezvous store hosted by the launcher, here the test process), so the
trainer's own multi-rank path is what runs. torchrun itself still launches the ranks of
tests/consumers/trainer/test_trainer_data_parallel.py (`astraflow train` under torchrun)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from astraflow.core.forkserver import ForkedProcess, ForkServer
from astraflow.core.gang import host_store, rank_env

ROOT = Path(__file__).resolve().parents[1]  # for the workers' imports of bench.lib

_server: ForkServer | None = None


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def server() -> ForkServer:
    """This test process's fork server (started on first use, with no rank's variables)."""
    global _server
    if _server is None:
        _server = ForkServer("torch")
        _server.prestart(_env())
    return _server


def _log(path: Path) -> str:
    """The end of a rank's log, before the report of leaked bindings that triton's nanobind
    module writes at every interpreter's exit (kilobytes that would hide the error)."""
    text = path.read_text(errors="replace")
    cut = text.find("nanobind: leaked")
    return (text if cut < 0 else text[:cut])[-4000:]


class RanksFailed(AssertionError):
    """A rank exited non-zero or the ranks outlived their time; the message has their logs."""


def run_ranks(script: Path, args: list[str], *, ranks: int, logs: Path,
              timeout: float = 900.0) -> None:
    """``python SCRIPT *args`` on ``ranks`` forked processes (one: no distributed variables at
    all, as a plain run), each run as ``python -m`` runs the script's module from its folder.
    When one rank fails the others are killed (a rank left alone would wait in a collective
    until its timeout); :class:`RanksFailed` says which."""
    logs.mkdir(parents=True, exist_ok=True)
    store = host_store(ranks) if ranks > 1 else None  # held until the ranks are done
    env = _env()
    children: list[ForkedProcess] = []
    try:
        for r in range(ranks):
            renv = env if store is None else {**env, **rank_env(r, ranks, store.port)}
            children.append(server().start([sys.executable, "-m", script.stem, *args], renv,
                                           logs / f"rank{r}.log", cwd=str(script.parent)))
        deadline = time.monotonic() + timeout
        while True:
            codes = [c.poll() for c in children]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = (f"rank {failed[0][0]} exited with {failed[0][1]}" if failed else
                       f"the ranks ran past {timeout:.0f} s")
                raise RanksFailed(why + "\n" + "\n".join(
                    f"--- rank {r}:\n{_log(logs / f'rank{r}.log')}" for r in range(ranks)))
            if all(c == 0 for c in codes):
                return
            time.sleep(0.05)
    finally:
        for c in children:
            if c.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.pid, signal.SIGKILL)  # (a forked role leads its own session)
                with contextlib.suppress(Exception):
                    c.wait(30)
