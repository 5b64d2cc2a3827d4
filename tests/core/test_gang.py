"""astraflow.core.gang: N ranks with torchrun's environment that live and die together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from waiting import alive, wait_for

from astraflow.core.gang import gang_argv

RANK = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
rank = os.environ["RANK"]
def put(name, text):  # whole or absent: the test reads a file as soon as it exists
    (out / f"{name}.part").write_text(text)
    os.replace(out / f"{name}.part", out / name)
def stop(*_):
    put(f"stopped{rank}", "")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)  # before the pid file: the test signals once it is there
put(f"env{rank}", " ".join(os.environ[k] for k in (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")))
put(f"pid{rank}", str(os.getpid()))
mode = sys.argv[2]
if mode == "exit":
    sys.exit(0)
if mode == "die" and rank == "1":
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""


def start(tmp_path: Path, mode: str, ranks: int = 2) -> subprocess.Popen[bytes]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    return subprocess.Popen(gang_argv(ranks, [sys.executable, str(script), str(tmp_path),
                                              mode]), start_new_session=True)


def test_ranks_get_torchrun_environment(tmp_path: Path) -> None:
    proc = start(tmp_path, "exit", ranks=3)
    assert proc.wait(60) == 0
    envs = [(tmp_path / f"env{r}").read_text().split() for r in range(3)]
    assert envs == [[str(r), str(r), "3", "127.0.0.1"] for r in range(3)]


def test_one_rank_killed_takes_the_gang_down(tmp_path: Path) -> None:
    proc = start(tmp_path, "die")
    wait_for((tmp_path / "pid0").exists, 60, "pid0 written")
    rank0 = int((tmp_path / "pid0").read_text())
    assert proc.wait(60) == 1  # for its launcher to restart it whole
    assert not alive(rank0)
    assert not (tmp_path / "stopped0").exists()  # SIGKILLed, not asked to stop


def test_sigterm_reaches_every_rank(tmp_path: Path) -> None:
    proc = start(tmp_path, "wait")
    wait_for((tmp_path / "pid0").exists, 60, "pid0 written")
    wait_for((tmp_path / "pid1").exists, 60, "pid1 written")
    os.kill(proc.pid, signal.SIGTERM)  # the gang alone: it passes the signal on
    assert proc.wait(60) == 0
    assert (tmp_path / "stopped0").exists() and (tmp_path / "stopped1").exists()
