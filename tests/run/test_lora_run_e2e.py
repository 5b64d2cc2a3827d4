"""`astraflow run` on the quickstart with a LoRA trainer sharded over two ranks
(``trainer.lora`` + ``trainer.parallel=fsdp`` + ``launch.trainer_ranks=2``), from the
session's warm model, with trainer rank 1 SIGKILLed midway: the gang restarts whole from its
last sharded checkpoint, every trajectory is accounted for (none lost, none trained twice),
the rollout worker follows the adapter versions the trainer publishes, and the run learns.

The LoRA learning rate is the one bench/lora.py measured for r=8 on the quickstart (1e-3:
held-out 0.318 -> 0.348 at step 75; 3e-3 rose faster, then collapsed by step 100)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import check_finished, rl_rewards
from test_fsdp_run_e2e import run_killing_rank_1
from test_quickstart_e2e import BUDGET, STEPS

SETS = [*BUDGET, "trainer.checkpoint_every=5", "trainer.parallel=fsdp",
        "launch.trainer_ranks=2", "trainer.lora={r: 8, alpha: 16}",
        "trainer.optimizer.lr=1.0e-3", "launch.timeout_s=900"]
# The train reward of the last 50 steps is at least this far above that of the first 25
# (the one-process full fine-tuning run's check in test_quickstart_e2e.learned).
MARGIN = 0.02


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the session's warm-up (~1-5 min on a shared host) and the run
def test_a_sharded_lora_trainer_learns_and_survives_a_killed_rank(
        tmp_path: Path, quickstart_warmup: Path) -> None:
    out = tmp_path / "run"
    rc, output = run_killing_rank_1(out, quickstart_warmup, SETS, deadline_s=1800)
    summary = check_finished(out, rc, output, steps=STEPS, per_step=64 * 8)
    trainer = summary["roles"]["trainer-default"]
    assert trainer["restarts"] >= 1 and 1 in trainer["exit_codes"], trainer
    rows = [json.loads(x) for x in (out / "trainer-default.jsonl").read_text().splitlines()]
    starts = [r for r in rows if r.get("event") == "start"]
    assert len(starts) >= 2 and starts[1]["resumed"] and starts[1]["version"] >= 10, starts
    # the rollout worker generated with the trainer's adapters: its weight versions advanced
    versions = [json.loads(x).get("weight_version_min") for x in
                (out / "metrics.jsonl").read_text().splitlines() if "weight_version_min" in x]
    assert versions and max(v for v in versions if v is not None) >= STEPS // 2, versions[-5:]
    assert (out / "final" / "default" / "model.safetensors").exists()  # adapter merged
    rewards = rl_rewards(out)
    assert len(rewards) == STEPS
    first, last = sum(rewards[:25]) / 25, sum(rewards[-50:]) / 50
    assert last >= first + MARGIN, (round(first, 3), round(last, 3))
