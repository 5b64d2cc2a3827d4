"""Two data-parallel CPU processes (torchrun, gloo) train like one: rank 0 reads the bus and
hands each batch over, every rank takes its share of micro-batches, gradients are summed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from trainer_helpers import produce, random_batch

from astraflow.config import load_experiment
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_trainer


def steps(out: Path) -> list[dict[str, Any]]:
    rows = map(json.loads, (out / "trainer-default.jsonl").read_text().splitlines())
    return [r for r in rows if "step" in r]


@pytest.mark.slow
def test_two_ranks_match_one(tmp_path: Path, tiny_dir: Path) -> None:
    batches = [random_batch(s, groups=6, group_size=4) for s in range(3)]
    trainer = {"checkpoint_every": 10, "max_steps": 3, "micro_batch_tokens": 30,
               "session_timeout_s": 1.0, "poll_timeout_s": 0.1, "optimizer": {"lr": 1e-3}}
    outs = {}
    for name in ("one", "two"):
        out = tmp_path / name
        out.mkdir()
        config = out / "experiment.yaml"
        config.write_text(yaml.safe_dump({
            "run": name, "bus": {"url": "embedded://{out}/bus.db"},
            "models": {"default": {"path": str(tiny_dir)}}, "trainer": trainer}))
        cfg = load_experiment(config)
        bus = open_bus(cfg, out)
        produce(bus, cfg.run, batches)
        outs[name] = (out, config, cfg, bus)

    out, _, cfg, bus = outs["one"]
    single = configured_trainer(cfg, "default", out, bus=bus)
    assert single.run(timeout=60).version == 3
    single.close()

    out, config, _, _ = outs["two"]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "astraflow.cli.train", str(config), "--out", str(out), "--no-publish"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    one, two = steps(outs["one"][0]), steps(outs["two"][0])
    assert [r["step"] for r in two] == [1, 2, 3]  # one log: rank 0's
    # the same parameters before step 1: the summed loss and gradient equal one process's
    assert two[0]["loss"] == pytest.approx(one[0]["loss"], abs=1e-6)
    assert two[0]["grad_norm"] == pytest.approx(one[0]["grad_norm"], rel=1e-5)
    for key in ("tokens", "micro_batches", "seqs_trained"):
        assert two[0][key] == one[0][key], key
    a = load_file(outs["one"][0] / "checkpoints/trainer-default/step-0000000003/model.safetensors")
    b = load_file(outs["two"][0] / "checkpoints/trainer-default/step-0000000003/model.safetensors")
    for k in a:  # Adam over 3 steps: lr-sized steps, rounding differences far below them
        assert torch.allclose(a[k], b[k], atol=1e-4, rtol=0), k
    for *_, bus in outs.values():
        bus.close()
