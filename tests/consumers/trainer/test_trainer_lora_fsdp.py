"""LoRA with FSDP2: a peft model sharded with ``fully_shard`` (per block and the root, frozen
base parameters sharded too) over two gloo ranks trains the adapter as one unsharded process
does, leaves the base alone and keeps AdamW state for the adapter only. The order this checks
(peft first, then sharding) is what the trainer's build must keep (consumers/trainer/lora.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from rank_launcher import run_ranks

pytest.importorskip("peft")
HERE = Path(__file__).parent


@pytest.mark.slow  # two rank processes (tests/rank_launcher.py)
def test_fsdp_of_a_peft_model_trains_like_one_process(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    sys.path.insert(0, str(HERE))
    from _lora_fsdp_worker import train

    out = tmp_path / "sharded.safetensors"
    run_ranks(HERE / "_lora_fsdp_worker.py", [str(tiny_dir), str(out)], ranks=2,
              logs=tmp_path / "logs", timeout=240)
    sharded = load_file(str(out))
    single = train(str(tiny_dir), shard=False)
    assert sharded.keys() == single.keys()
    base = load_file(str(tiny_dir / "model.safetensors"))
    adapters = 0
    for n, t in single.items():
        if n == "__moments__":
            continue
        if ".lora_" in n:
            adapters += 1
            assert torch.allclose(sharded[n], t, rtol=1e-5, atol=1e-6), n
        else:
            key = n.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(sharded[n], base[key]), f"frozen {n} moved under FSDP"
    # AdamW state for the adapter tensors only (2 per targeted module: A and B)
    assert sharded["__moments__"].item() == adapters == single["__moments__"].item()
