"""The tiny model learns through the trainer on the bus: SFT loss falls on a toy dataset;
RL on batches sampled from (one version behind) the trainer's own weights raises a reward
whose best answer is known."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from trainer_helpers import SEVEN, TOK, produce, sample, sft_batch, trajectory

from astraflow.core.records import Batch, Group
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_trainer


def steps(log: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if "step" in r]


def test_sft_loss_falls(experiment: Any, tmp_path: Path) -> None:
    cfg = experiment(trainer={"mode": "sft", "optimizer": {"lr": 2e-3},
                              "checkpoint_every": 100, "max_steps": 40})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [sft_batch(s) for s in range(40)])
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
    stats = trainer.run(timeout=120)
    trainer.close()
    assert stats.steps == 40 and stats.version == 40
    losses = [r["loss"] for r in steps(tmp_path / "trainer-default.jsonl")]
    first, last = np.mean(losses[:3]), np.mean(losses[-3:])
    assert first > 2.0  # ~ln(17) from a random init
    assert last < 0.6 * first, losses


@pytest.mark.slow
def test_rl_raises_reward_with_stale_samples(experiment: Any, tmp_path: Path) -> None:
    """Reward: the fraction of the 4 generated tokens that are '7'. A random model emits it
    ~1/17 of the time. Batches are sampled from the weights one version behind the trainer,
    so every batch after the first is off-policy and goes through the decoupled correction."""
    cfg = experiment(trainer={"optimizer": {"lr": 3e-3}, "checkpoint_every": 100})
    bus = open_bus(cfg, tmp_path)
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
    trainer.setup()
    behaviour = copy.deepcopy(trainer.state.model)
    gen = torch.Generator().manual_seed(0)
    prompts_n, group = 8, 8
    rewards = []
    for step in range(12):
        rng = np.random.default_rng(step)
        prompts = [TOK(f"{a}+{b}=").input_ids for a, b in rng.integers(0, 10, (prompts_n, 2))]
        plen = len(prompts[0])
        ids, lps = sample(behaviour, prompts, group, 4, gen)
        r = (ids[:, plen:] == SEVEN).float().mean(1)
        rewards.append(float(r.mean()))
        groups = [Group(group_id=f"{step}-{i}", task_id=str(i), trajectories=[
            trajectory(ids[i * group + k].tolist(), plen, reward=float(r[i * group + k]),
                       logprobs=lps[i * group + k].tolist(), version=max(step - 1, 0),
                       tid=f"{step}-{i}-{k}", group_id=f"{step}-{i}") for k in range(group)])
            for i in range(prompts_n)]
        produce(bus, cfg.run, [Batch(id=f"default-{step}", policy="default", seq=step,
                                     groups=groups)])
        behaviour.load_state_dict(trainer.state.model.state_dict())  # lags one version
        assert trainer.run(max_steps=1, timeout=30).steps == 1
    trainer.close()
    log = steps(tmp_path / "trainer-default.jsonl")
    assert [r["step"] for r in log] == list(range(1, 13))
    assert max(r["staleness_max"] for r in log) == 1.0
    assert np.mean(rewards[:2]) < 0.15
    assert np.mean(rewards[-2:]) > 0.5, rewards
