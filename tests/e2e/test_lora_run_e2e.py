"""`astraflow run` on the quickstart with a LoRA trainer sharded over two ranks
(``trainer.lora`` + ``trainer.parallel=fsdp`` + ``launch.trainer_ranks=2``), from the
session's warm model, with trainer rank 1 SIGKILLed midway: the gang restarts whole from its
last sharded checkpoint, every trajectory is accounted for (none lost, none trained twice),
the rollout worker follows the adapter versions the trainer publishes, and the run ends with the
adapter merged into its final model.

Learning is not this test's to show (150 steps of two ranks: ~170 s alone, ~280 s beside
another test): tests/consumers/trainer/test_trainer_lora_fsdp.py shows two sharded ranks train a peft
model as one process does, bench/lora.py that LoRA learns on the quickstart (r=8, lr 1e-3:
held-out 0.318 -> 0.348 at step 75), and bench/learning.py's `lora-sharded` scenario runs this
same configuration for 150 steps and checks its train reward rises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_helpers import SMALL_BATCH, check_finished, train_rewards
from test_fsdp_run_e2e import STEPS, run_killing_rank_1

SETS = [f"trainer.max_steps={STEPS}", "launch.eval_every=40", "trainer.checkpoint_every=5",
        "trainer.parallel=fsdp", "launch.trainer_ranks=2", "trainer.lora={r: 8, alpha: 16}",
        "trainer.optimizer.lr=1.0e-3", "launch.timeout_s=600", f"data.batch_size={SMALL_BATCH}"]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the session's warm-up (~1-5 min on a shared host) and the run
def test_a_sharded_lora_trainer_survives_a_killed_rank(
        tmp_path: Path, quickstart_warmup: Path) -> None:
    out = tmp_path / "run"
    rc, output = run_killing_rank_1(out, quickstart_warmup, SETS, deadline_s=800)
    summary = check_finished(out, rc, output, steps=STEPS, per_step=SMALL_BATCH * 8)
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
    assert len(train_rewards(out)) == STEPS
