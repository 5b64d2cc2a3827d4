"""bench/learning.py: every scenario's command line is a valid run of its example (the keys it
sets exist, the values validate), and the reward curve is read as the trainer logged it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import learning
from bench.lib.runlog import train_rewards

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(learning.SCENARIOS))
def test_every_scenario_is_a_valid_run_of_its_example(name: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import astraflow.run.warmup
    from astraflow.config import load_experiment

    model = tmp_path / "warm" / "models" / "default-warm"
    monkeypatch.setattr(astraflow.run.warmup, "start_models", lambda run: {"default": model})
    s = learning.SCENARIOS[name]
    args = learning.run_args(s, tmp_path / "warm", tmp_path / "out")
    assert args[:2] == ["run", str(ROOT / "examples" / s.config)]
    assert ("--warm" in args) == (s.warm == "flag")
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    cfg = load_experiment(ROOT / "examples" / s.config, sets)
    assert cfg.trainer.max_steps == s.steps >= s.first + s.last
    if s.every is not None:  # held-out evaluations on the grid learning is judged on
        assert cfg.launch.eval_every == s.every
    if s.warm == "path":
        assert cfg.model("default").path == str(model) and cfg.launch.warmup.steps == 0


def test_the_held_out_curve_is_the_newest_evaluation_at_each_grid_step(tmp_path: Path) -> None:
    rows = [{"policy": "default", "step": s, "eval_accuracy": a}
            for s, a in [(0, 0.27), (7, 0.3), (10, 0.31), (18, 0.2), (20, 0.5)]]
    rows.insert(2, {"policy": "default", "step": 9, "reward_mean": 0.4})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert learning.held_out(tmp_path, 10, 30) == [0.27, 0.31, 0.5, 0.5]


def test_the_curve_is_the_trainers_rl_steps_once_each(tmp_path: Path) -> None:
    rows = [{"step": 1, "batch_id": "default-sft-1", "reward_mean": 0.9},
            {"step": 1, "batch_id": "b1", "reward_mean": 0.1},
            {"step": 2, "batch_id": "b2", "reward_mean": 0.2},
            {"event": "start", "resumed": True},
            {"step": 2, "batch_id": "b2", "reward_mean": 0.25},  # a restarted trainer's again
            {"step": 3, "batch_id": "b3", "reward_mean": 0.3}]
    (tmp_path / "trainer-default.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert train_rewards(tmp_path) == [0.1, 0.25, 0.3]
