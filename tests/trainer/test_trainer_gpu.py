"""A few RL steps on CUDA through the bus: finite losses, weights published (bf16)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import produce, random_batch

from astraflow.core.records import WeightManifest, decode
from astraflow.core.topics import topic_name
from astraflow.run.resources import open_bus
from astraflow.run.roles import build_trainer
from astraflow.weights import FileStore, Publisher


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_rl_steps_on_cuda(experiment: Any, tmp_path: Path, precision: str) -> None:
    cfg = experiment(trainer={"device": "cuda", "mixed_precision": precision, "max_steps": 3,
                              "checkpoint_every": 2,
                              "loss": {"kl": "k3", "kl_coef": 0.01, "dual_clip": 3.0}})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(3)])
    publisher = Publisher(bus, run=cfg.run, policy="default",
                          store=FileStore(tmp_path / "weights"))
    trainer = build_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
    assert next(trainer.engine.model.parameters()).is_cuda
    stats = trainer.run(timeout=120)
    trainer.close()
    publisher.close()
    assert stats.version == 3
    rows = [json.loads(x) for x in (tmp_path / "trainer-default.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "step" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    consumer = bus.consumer("gpu-test-reader", [topic_name(cfg.run, "weights", "default")])
    versions: set[int] = set()
    for _ in range(50):
        if versions >= {1, 2, 3}:
            break
        versions |= {decode(m.value, WeightManifest).version for m in consumer.consume(10, 0.2)}
    consumer.close()
    assert versions >= {1, 2, 3}
    # resume on the same device from the checkpoint at 3
    again = build_trainer(cfg, "default", tmp_path, bus=bus)
    again.setup()
    assert again.version == 3 and next(again.engine.model.parameters()).is_cuda
    again.close()
