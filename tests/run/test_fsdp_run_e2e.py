"""`astraflow run` on the quickstart with a sharded trainer: ``trainer.parallel=fsdp`` and
``launch.trainer_ranks=2`` on the embedded bus, from the session's warm model, with trainer
rank 1 SIGKILLed midway. The gang (astraflow.core.gang) kills rank 0 too, the supervisor
restarts the trainer role as a whole, it resumes from its last sharded checkpoint, and the
run ends with every trajectory accounted for (none lost, none trained twice).

The same run passes the one-process quickstart's learning check; the equality tests
(tests/trainer/test_trainer_parallel.py) show that 2 fsdp ranks compute what one process
computes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from run_helpers import check_finished, launched, rl_rewards
from test_quickstart_e2e import QUICKSTART, trainer_step


def rank_pid(gang: int, rank: int) -> int | None:
    """The pid of rank ``rank`` among the gang's children (their RANK variable)."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == gang and f"RANK={rank}".encode() in env:
            return int(p.name)
    return None


def run_killing_rank_1(out: Path, warm: Path, sets: list[str], *,
                       deadline_s: float) -> tuple[int, str]:
    """`astraflow run` of the quickstart from ``warm`` with ``sets``, trainer rank 1 SIGKILLed
    once the trainer has taken 12 steps; the run's exit code and output."""
    args = ["run", str(QUICKSTART), "--out", str(out), "--no-live", "--warm", str(warm),
            *[a for s in sets for a in ("--set", s)]]
    killed = None
    with launched(args, out) as (proc, log):
        deadline = time.monotonic() + deadline_s
        while proc.poll() is None and time.monotonic() < deadline:
            if killed is None and trainer_step(out) >= 12:
                gang = json.loads((out / "processes.json").read_text())["trainer-default"]
                killed = rank_pid(gang, 1)
                assert killed is not None, "no rank 1 under the trainer's gang"
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.5)
        proc.wait(60)
    assert killed is not None, "the run ended before the kill"
    return proc.returncode, log.read_text()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the session's warm-up (~1-5 min on a shared host) and the run
def test_fsdp_trainer_survives_a_killed_rank_and_learns(tmp_path: Path,
                                                        quickstart_warmup: Path) -> None:
    """One run does both (two runs took ~4 minutes of CI): the quickstart's reduced budget
    (150 RL steps) with 2 fsdp trainer ranks, rank 1 SIGKILLed at step 12, restarts whole from
    its sharded checkpoint, accounts for every trajectory and passes the one-process run's
    learning check (test_quickstart_e2e.learned: train reward up by 0.02, held-out accuracy
    not collapsed)."""
    from test_quickstart_e2e import BUDGET, learned
    from test_quickstart_e2e import STEPS as LEARN_STEPS

    out = tmp_path / "run"
    sets = [*BUDGET, "trainer.checkpoint_every=5", "trainer.parallel=fsdp",
            "launch.trainer_ranks=2", "launch.timeout_s=900"]
    rc, output = run_killing_rank_1(out, quickstart_warmup, sets, deadline_s=1500)
    summary = check_finished(out, rc, output, steps=LEARN_STEPS, per_step=64 * 8)
    trainer = summary["roles"]["trainer-default"]
    assert trainer["restarts"] >= 1 and 1 in trainer["exit_codes"], trainer
    assert "rank 1 of 2 exited with -9" in (out / "logs" / "trainer-default.log").read_text()
    rows = [json.loads(x) for x in (out / "trainer-default.jsonl").read_text().splitlines()]
    starts = [r for r in rows if r.get("event") == "start"]
    assert len(starts) >= 2 and starts[1]["resumed"] and starts[1]["version"] % 5 == 0
    assert starts[1]["version"] >= 10, starts  # resumed from a sharded checkpoint, not 0
    ckpt = out / "checkpoints" / "trainer-default" / f"step-{LEARN_STEPS:010d}"
    assert json.loads((ckpt / "meta.json").read_text())["layout"] == "dcp"
    assert (out / "final" / "default" / "model.safetensors").exists()
    assert len(rl_rewards(out)) == LEARN_STEPS
    learned(out, quickstart_warmup)
