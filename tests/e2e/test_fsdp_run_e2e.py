"""`astraflow run` on the quickstart with a sharded trainer: ``trainer.parallel=fsdp`` and
``launch.trainer_ranks=2`` on the embedded bus, from the session's warm model, with trainer
rank 1 SIGKILLed midway. The gang (astraflow.core.gang) kills rank 0 too, the supervisor
restarts the trainer role as a whole, it resumes from its last sharded checkpoint, and the
run ends with every trajectory accounted for (none lost, none trained twice).

Learning is not this test's to show: the equality tests (tests/consumers/trainer/test_trainer_parallel.py)
show that 2 fsdp ranks compute what one process computes, and the quickstart learns in one
process (test_quickstart_e2e); bench/learning.py runs the longer learning scenarios."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from run_helpers import SMALL_BATCH, check_finished, launched, train_rewards
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
            time.sleep(0.2)
        proc.wait(60)
    assert killed is not None, "the run ended before the kill"
    return proc.returncode, log.read_text()


#: trainer steps of the run: rank 1 is killed at step 12, after the checkpoints at 5 and 10,
#: and the restarted gang trains on to the end
STEPS = 20


@pytest.mark.slow
@pytest.mark.timeout(900)  # the session's warm-up (~1-5 min on a shared host) and the run
def test_fsdp_trainer_survives_a_killed_rank(tmp_path: Path, quickstart_warmup: Path) -> None:
    """The quickstart's RL phase, STEPS steps with 2 fsdp trainer ranks: rank 1 SIGKILLed at
    step 12, the gang restarts whole from its sharded checkpoint, the run finishes its steps
    with every trajectory accounted for and leaves its final model."""
    out = tmp_path / "run"
    sets = [f"trainer.max_steps={STEPS}", "launch.eval_every=40", "trainer.checkpoint_every=5",
            "trainer.parallel=fsdp", "launch.trainer_ranks=2", "launch.timeout_s=600",
            f"data.batch_size={SMALL_BATCH}"]
    rc, output = run_killing_rank_1(out, quickstart_warmup, sets, deadline_s=800)
    summary = check_finished(out, rc, output, steps=STEPS, per_step=SMALL_BATCH * 8)
    trainer = summary["roles"]["trainer-default"]
    assert trainer["restarts"] >= 1 and 1 in trainer["exit_codes"], trainer
    assert "rank 1 of 2 exited with -9" in (out / "logs" / "trainer-default.log").read_text()
    rows = [json.loads(x) for x in (out / "trainer-default.jsonl").read_text().splitlines()]
    starts = [r for r in rows if r.get("event") == "start"]
    assert len(starts) >= 2 and starts[1]["resumed"] and starts[1]["version"] % 5 == 0
    assert starts[1]["version"] >= 10, starts  # resumed from a sharded checkpoint, not 0
    ckpt = out / "checkpoints" / "trainer-default" / f"step-{STEPS:010d}"
    assert json.loads((ckpt / "meta.json").read_text())["layout"] == "dcp"
    assert (out / "final" / "default" / "model.safetensors").exists()
    assert len(train_rewards(out)) == STEPS
