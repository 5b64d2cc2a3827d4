"""The main job end to end, through the real CLI: `astraflow run examples/quickstart.yaml`
with a reduced budget, on the embedded bus (a rollout process SIGKILLed midway; it learns) and,
shorter, on Kafka (the same roles and checks on another bus; learning is not the bus's to
show).
The SFT warm-up runs once per session (the ``quickstart_warmup`` fixture: the same command with
``--warmup-only``); both RL runs here start from the model it landed on (``--warm``)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from run_helpers import check_finished, launched, run_astraflow, train_rewards

from astraflow.run.warmup import start_models

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
# Reduced budget: the quickstart's warm-up (SFT until held-out accuracy is inside the quickstart's
# launch.warmup.target_accuracy; the session's fixture), then 150 RL steps instead of 5 minutes
# (see `learned` for what they do and do not reliably show).
STEPS = 150
KAFKA_STEPS = 10  # every role on another bus, not learning (the embedded run's)


def budget(steps: int = STEPS) -> list[str]:
    """The ``--set`` values of the quickstart's reduced RL budget of ``steps`` trainer steps."""
    return [f"trainer.max_steps={steps}", "launch.eval_every=40", "launch.timeout_s=400"]


BUDGET = budget()


def run_args(out: Path, warmup: Path, *extra: str, steps: int = STEPS) -> list[str]:
    """The quickstart's RL phase from the warm model of the ``warmup`` run (``--warm``), for
    ``steps`` trainer steps."""
    sets = [a for s in budget(steps) for a in ("--set", s)]
    return ["run", str(QUICKSTART), "--out", str(out), "--no-live", "--warm", str(warmup),
            *sets, *extra]


def trainer_step(out: Path) -> int:
    step = 0
    path = out / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if str(row.get("source", "")).startswith("trainer"):
                step = max(step, int(row["step"]))
    return step


def check_run(out: Path, rc: int, output: str, steps: int = STEPS) -> dict:
    # every trained batch: 64 groups × 8 trajectories
    summary = check_finished(out, rc, output, steps=steps, per_step=64 * 8)
    acc = summary["accounting"]
    assert acc["produced"] == sum(v for k, v in acc.items()
                                  if k not in ("produced", "unaccounted", "trained_twice"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("time" in r and "step" in r for r in rows)
    # the core split it chose, and where every second of the compute roles went
    assert "cores: " in output and "shared by trainer-default, rollout-0" in output, output
    spent = summary["time"]
    trainer, rollout = spent["trainer-default"], spent["rollout"]
    assert {"load", "wait", "train", "publish", "other"} <= set(trainer), trainer
    assert {"load", "generate", "other"} <= set(rollout), rollout
    for row in (trainer, rollout):
        phases = sum(v for k, v in row.items() if k not in ("alive", "processes", "other"))
        assert 0 < phases <= row["alive"] + 1.0, row
    assert trainer["train"] > 0 and rollout["generate"] > 0
    assert 0 < summary["first_version_s"] < summary["elapsed_s"], summary
    evals = [r for r in rows if "eval_accuracy" in r]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == steps
    assert {p.name for p in (out / "plots").glob("*.png")} >= {
        "reward_accuracy_vs_step.png", "reward_accuracy_vs_elapsed.png", "throughput.png",
        "wait_ratio.png"}
    assert (out / "final" / "default" / "model.safetensors").exists()
    assert (out / "config.yaml").exists() and (out / "logs" / "trainer-default.log").exists()
    # no train-inference mismatch alarm (trainer.mismatch); the first step's tokens, sampled
    # with the very weights the trainer loaded, agree to rounding; later fresh tokens were
    # sampled with the bfloat16 copy the engine receives (weights.dtype): small, not zero
    # (docs/trainer.md#train-inference-mismatch)
    steps_rows = [json.loads(x) for x in (out / "trainer-default.jsonl").read_text().splitlines()
                  if '"loss"' in x]
    assert all(r["mismatch_alarm"] == 0.0 for r in steps_rows)
    first = min(steps_rows, key=lambda r: r["step"])
    assert first["step"] == 1 and first["mismatch_tokens_stale"] == 0, first
    assert first["mismatch_k3_fresh"] < 1e-9, first
    fresh = [r["mismatch_k3_fresh"] for r in steps_rows if r["mismatch_tokens_fresh"]]
    assert max(fresh) < 1e-3, fresh
    return summary


def landing(warmup: Path) -> tuple[float, tuple[float, float]]:
    """The warm-up run's landing: (held-out accuracy at the check it stopped at, the band)."""
    warm = json.loads((warmup / "summary.json").read_text())["warmup"]
    landed = warm["policies"]["default"]
    assert landed["outcome"] == "in_band", warm
    low, high = warm["band"]
    return landed["accuracy"], (low, high)


@pytest.mark.slow  # the session's quickstart warm-up (~60 s)
def test_the_warm_up_lands_in_the_band(quickstart_warmup: Path) -> None:
    accuracy, (low, high) = landing(quickstart_warmup)
    assert low <= accuracy <= high
    summary = json.loads((quickstart_warmup / "summary.json").read_text())
    assert summary["warmup_only"] is True and "trainer_steps" not in summary, summary
    # --warmup-only started no RL role, and says where RL would start (what --warm reads)
    assert not (quickstart_warmup / "logs" / "trainer-default.log").exists()
    warm = quickstart_warmup / "models" / "default-warm"
    assert start_models(quickstart_warmup) == {"default": warm.resolve()}


def learned(out: Path, warmup: Path) -> None:
    """Both phases taught the model. The SFT warm-up: RL starts inside the configured band —
    the evaluator's version 0 (the warm model) measures what the warm-up's landing check
    measured, on the same problems.

    RL: the train reward (the objective GRPO climbs: 512 sampled completions a step) rose by at
    least 0.04 over the first 25 steps in some later 25-step window, and held-out greedy accuracy
    did not collapse (GRPO at lr 1e-3 takes it to ~0 within 60 steps). Why a window and not the
    run's end: GRPO's climb dips on the way. A CI run from a landing at 0.318 rose from 0.19
    (steps 1-25) to 0.26 (steps 51-90), fell to 0.18 (steps 101-110) and was back at 0.24 by
    step 150: its last 50 steps were only +0.018 above its first 25, though it had learned
    (held-out 0.318 → 0.342). Earlier runs measured, last 50 against first 25: +0.047 from a
    landing at 0.266, +0.115 and +0.079 from 0.318. Without learning, the best of the later
    windows is above the first by one or two times a window's noise (a 25-step mean jitters by
    ~0.006 here: steps 1-25 of that run, sd 0.018 a step, lag-1 correlation 0.47): 0.04 is far
    above that.
    Why not a held-out gain: 200 steps from the band do not reliably give
    one. The landing is the first check inside the
    band, so it is a high point of a jittering SFT trajectory (0.266 right after 0.19); from
    there three runs measured 0.266 → 0.268 (last two evaluations' mean), 0.266 → 0.244 (CI)
    and 0.266 → 0.286, while runs started from higher landings gained +0.06 and more, and the
    5-minute runs of docs/results/quickstart.md (650-900 steps) reached 0.58 and 0.70. One evaluation alone can dip
    by ~0.08 (0.284 → 0.204 in the CI run)."""
    rewards = train_rewards(out)
    assert len(rewards) == STEPS, len(rewards)
    window = 25
    means = [sum(rewards[i:i + window]) / window for i in range(len(rewards) - window + 1)]
    first, best = means[0], max(means[window:])
    assert best >= first + 0.04, (round(first, 3), round(best, 3))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
    assert (evals[-1] + evals[-2]) / 2 >= evals[0] - 0.08, evals
    assert evals[0] == landing(warmup)[0], evals


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~4 min here beside another test; more on a slower CI host
def test_quickstart_runs_and_survives_a_killed_rollout_process(tmp_path: Path,
                                                               quickstart_warmup: Path) -> None:
    out = tmp_path / "run"
    killed = None
    with launched(run_args(out, quickstart_warmup), out) as (proc, log):
        deadline = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < deadline:
            if killed is None and trainer_step(out) >= 20:
                pids = json.loads((out / "processes.json").read_text())
                killed = pids["rollout-0"]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.5)
        proc.wait(60)
    output = log.read_text()
    assert killed is not None, "the run ended before the kill"
    summary = check_run(out, proc.returncode, output)
    rollout0 = summary["roles"]["rollout-0"]
    assert rollout0["restarts"] >= 1 and -signal.SIGKILL in rollout0["exit_codes"], rollout0
    assert "role rollout-0 died (exit -9); restarting" in output
    learned(out, quickstart_warmup)


@pytest.mark.slow
@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_the_same_experiment_on_kafka(tmp_path: Path, kafka_bootstrap: str,
                                      quickstart_warmup: Path) -> None:
    """The same run on Kafka, KAFKA_STEPS steps: every role, every batch accounted, the
    evaluations, plots and final model; no role restarted. Learning is shown on the embedded
    bus above (150 steps: ~4 min here); the bus's semantics are tests/core/test_kafka.py's."""
    out = tmp_path / "run"
    rc, output = run_astraflow(
        run_args(out, quickstart_warmup, "--bus", f"kafka://{kafka_bootstrap}",
                 "--set", f"run=qs{os.getpid()}",  # a fresh run (topics) on the shared broker
                 steps=KAFKA_STEPS), out, timeout=600)
    summary = check_run(out, rc, output, steps=KAFKA_STEPS)
    assert all(r["restarts"] == 0 for r in summary["roles"].values()), summary["roles"]
    rewards = train_rewards(out)
    assert len(rewards) == KAFKA_STEPS and all(0.0 <= r <= 1.0 for r in rewards), rewards
