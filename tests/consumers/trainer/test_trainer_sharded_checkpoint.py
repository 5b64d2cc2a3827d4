"""Sharded (fsdp) checkpoints through torch.distributed.checkpoint: resume bit-exact at the
same world size, and load at another (2 → 1, 1 → 2 ranks) into exactly the unsharded state;
a single-file checkpoint (the ddp format, format 1) loads into an fsdp trainer.

Each run is fsdp_worker.py (1 process, or 2 on gloo; tests/rank_launcher.py); "equal" is
``torch.equal`` of the whole weights and the whole AdamW state by parameter name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_trainer_parallel import run_worker

pytestmark = pytest.mark.slow


def optim(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "optim.safetensors"))


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, unequal[:5]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> dict[str, Any]:
    """2-rank fsdp: 3 steps then a checkpoint (and its whole state)."""
    tmp = tmp_path_factory.mktemp("saved")
    result = run_worker(tiny_dir, tmp / "out", ranks=2, parallel="fsdp",
                        extra=("--steps", "3", "--save", str(tmp / "ckpt")))
    return {**result, "out": tmp / "out", "ckpt": tmp / "ckpt"}


def test_layout(saved: dict[str, Any]) -> None:
    step = saved["ckpt"] / "step-0000000003"
    meta = json.loads((step / "meta.json").read_text())
    assert (meta["format"], meta["layout"], meta["world"], meta["version"]) == (2, "dcp", 2, 3)
    files = sorted(meta["files"])
    assert files == sorted(["rng.safetensors", "dcp/.metadata", "dcp/__0_0.distcp",
                            "dcp/__1_0.distcp"])
    assert not list(saved["ckpt"].glob(".tmp-*"))


def test_resume_exact_at_the_same_world_size(saved: dict[str, Any], tiny_dir: Path,
                                             tmp_path: Path) -> None:
    straight = run_worker(tiny_dir, tmp_path / "straight", ranks=2, parallel="fsdp")
    resumed = run_worker(tiny_dir, tmp_path / "resumed", ranks=2, parallel="fsdp",
                         extra=("--load", str(saved["ckpt"]), "--first", "3", "--steps", "2"))
    assert resumed["version"] == 5
    assert resumed["steps"] == straight["steps"][3:]  # the same floats
    assert_equal(straight["params"], resumed["params"])
    assert_equal(optim(tmp_path / "straight"), optim(tmp_path / "resumed"))


@pytest.mark.parametrize("ranks,parallel", [(1, "ddp"), (1, "fsdp")])
def test_two_ranks_to_one(saved: dict[str, Any], tiny_dir: Path, tmp_path: Path,
                          ranks: int, parallel: str) -> None:
    """The 2-rank shards load into one unsharded process (ddp: whole tensors, no
    collectives) and into one fsdp rank: the same weights and optimizer state."""
    loaded = run_worker(tiny_dir, tmp_path / "one", ranks=ranks, parallel=parallel,
                        extra=("--load", str(saved["ckpt"]), "--steps", "0"))
    assert loaded["version"] == 3
    assert_equal(saved["params"], loaded["params"])
    assert_equal(optim(saved["out"]), optim(tmp_path / "one"))


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_one_rank_to_two(parallel: str, tiny_dir: Path, tmp_path: Path) -> None:
    """A 1-rank checkpoint loads into 2 fsdp ranks: ddp's single-file format (the format of
    every checkpoint written before fsdp) and a world-size-1 DCP one."""
    one = run_worker(tiny_dir, tmp_path / "one", parallel=parallel,
                     extra=("--steps", "3", "--save", str(tmp_path / "ckpt")))
    meta = json.loads((tmp_path / "ckpt/step-0000000003/meta.json").read_text())
    assert meta["format"] == (1 if parallel == "ddp" else 2)
    two = run_worker(tiny_dir, tmp_path / "two", ranks=2, parallel="fsdp",
                     extra=("--load", str(tmp_path / "ckpt"), "--steps", "0"))
    assert two["version"] == 3
    assert_equal(one["params"], two["params"])
    assert_equal(optim(tmp_path / "one"), optim(tmp_path / "two"))
