"""Checkpoints: a faithful round trip, atomic writes, damaged ones skipped, foreign ones
refused, old ones pruned."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_helpers import random_batch

from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.checkpoint import CheckpointDir, CheckpointError, CheckpointMeta
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.consumers.trainer.rl import rl_step


def trained_state(tiny_dir: Path, steps: int = 2):
    e = build_train_state(TrainerConfig(device="cpu"), tiny_dir)
    for v in range(steps):
        rl_step(e, random_batch(v), v)
    return e


def test_round_trip(tiny_dir: Path, tmp_path: Path) -> None:
    e = trained_state(tiny_dir)
    ckpts = CheckpointDir(tmp_path, run="r", policy="p")
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(6)
    meta = CheckpointMeta(version=2, offsets={"af.r.batches.p": {0: 2}}, recent=["p-0", "p-1"],
                          counters={"steps": 2.0})
    path = ckpts.save(e.model, e.optimizer, meta)
    assert sorted(p.name for p in path.iterdir()) == [
        "meta.json", "model.safetensors", "optimizer.safetensors", "rng.safetensors"]
    expect_rng = (torch.rand(3), random.random(), np.random.rand())

    fresh = build_train_state(TrainerConfig(device="cpu"), tiny_dir)
    loaded = ckpts.load(fresh.model, fresh.optimizer)
    assert loaded == meta
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (
        expect_rng[0].tolist(), expect_rng[1], expect_rng[2])
    for k, v in e.model.state_dict().items():
        assert torch.equal(v, fresh.model.state_dict()[k]), k
    a, b = e.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for pid, st in a["state"].items():
        for key, value in st.items():
            assert torch.equal(value, b["state"][pid][key]), (pid, key)
    # the same next step from both
    rl_step(e, random_batch(9), 2)
    rl_step(fresh, random_batch(9), 2)
    for k, v in e.model.state_dict().items():
        assert torch.equal(v, fresh.model.state_dict()[k]), k


def test_damaged_newest_falls_back_and_prunes(tiny_dir: Path, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    e = trained_state(tiny_dir, steps=1)
    ckpts = CheckpointDir(tmp_path, run="r", policy="p", keep=2)
    for v in (1, 2, 3):
        ckpts.save(e.model, e.optimizer, CheckpointMeta(version=v))
    assert ckpts.versions() == [3, 2]
    (tmp_path / ".tmp-step-0000000004-999999").mkdir()  # a crashed writer's leftovers
    blob = ckpts.path(3) / "model.safetensors"
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="astraflow.trainer.checkpoint"):
        meta = ckpts.load(e.model, e.optimizer)
    assert meta is not None and meta.version == 2
    assert "damaged" in caplog.text
    assert ckpts.versions() == [3, 2]  # the half-written one is not a checkpoint


def test_foreign_checkpoint_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    e = trained_state(tiny_dir, steps=0)
    CheckpointDir(tmp_path, run="r", policy="solver").save(e.model, e.optimizer,
                                                           CheckpointMeta(version=1))
    with pytest.raises(CheckpointError, match="belongs to run=r policy=solver"):
        CheckpointDir(tmp_path, run="r", policy="verifier").load(e.model, e.optimizer)


def test_meta_is_plain_json(tiny_dir: Path, tmp_path: Path) -> None:
    e = trained_state(tiny_dir, steps=1)
    path = CheckpointDir(tmp_path, run="r", policy="p").save(
        e.model, e.optimizer, CheckpointMeta(version=1, offsets={"t": {0: 1, 3: 7}}))
    meta = json.loads((path / "meta.json").read_text())
    assert meta["offsets"] == {"t": {"0": 1, "3": 7}}
    assert meta["optimizer"]["param_groups"][0]["lr"] == pytest.approx(3e-4)
    assert set(meta["files"]) == {"model.safetensors", "optimizer.safetensors",
                                  "rng.safetensors"}
