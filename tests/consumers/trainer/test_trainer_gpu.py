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
from astraflow.run.roles import configured_trainer
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
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
    assert next(trainer.state.model.parameters()).is_cuda
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
    again = configured_trainer(cfg, "default", tmp_path, bus=bus)
    again.setup()
    assert again.version == 3 and next(again.state.model.parameters()).is_cuda
    again.close()


@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=pytest.mark.slow),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_fsdp_bf16_steps(experiment: Any, tmp_path: Path, device: str) -> None:
    """FSDP2 on one device (world size 1) with bf16 params and fp32 reduce: 2 steps, weights
    published (gathered), a sharded checkpoint written and resumed."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    cfg = experiment(trainer={"device": device, "parallel": "fsdp", "max_steps": 2,
                              "checkpoint_every": 2,
                              "fsdp": {"param_dtype": "bf16", "reduce_dtype": "fp32"}})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(2)])
    publisher = Publisher(bus, run=cfg.run, policy="default",
                          store=FileStore(tmp_path / "weights"))
    try:
        trainer = configured_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
        p = next(trainer.state.model.parameters())
        assert isinstance(p, DTensor) and p.device.type == device
        assert p.dtype == torch.float32  # the sharded master weights
        stats = trainer.run(timeout=120)
        trainer.close()
        publisher.close()
        assert stats.version == 2
        rows = [json.loads(x)
                for x in (tmp_path / "trainer-default.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "step" in r]
        assert len(steps) == 2 and all(math.isfinite(r["loss"]) and r["nonfinite_grad"] == 0
                                       for r in steps)
        meta = json.loads((tmp_path / "checkpoints/trainer-default/step-0000000002/meta.json"
                           ).read_text())
        assert meta["layout"] == "dcp"
        again = configured_trainer(cfg, "default", tmp_path, bus=bus)
        again.setup()
        assert again.version == 2
        again.close()
    finally:
        bus.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fsdp_cpu_offload_steps_on_cuda(experiment: Any, tmp_path: Path) -> None:
    """FSDP2 with ``cpu_offload`` on a GPU: the sharded weights stay in (pinned) CPU memory,
    the forward and backward run on the GPU, the optimizer steps on the CPU; 2 finite steps."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    cfg = experiment(trainer={"device": "cuda", "parallel": "fsdp", "max_steps": 2,
                              "fsdp": {"cpu_offload": True}})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(2)])
    try:
        trainer = configured_trainer(cfg, "default", tmp_path, bus=bus)
        p = next(trainer.state.model.parameters())
        assert isinstance(p, DTensor) and p.device.type == "cpu"
        stats = trainer.run(timeout=120)
        trainer.close()
        assert stats.version == 2
        rows = [json.loads(x)
                for x in (tmp_path / "trainer-default.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "step" in r]
        assert len(steps) == 2 and all(math.isfinite(r["loss"]) for r in steps)
    finally:
        bus.close()
        if dist.is_initialized():
            dist.destroy_process_group()
