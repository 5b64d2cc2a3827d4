"""The trainer's memory model, on cases computed by hand, and the docs' table kept current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.run.trainer_memory import (
    SIZES,
    ModelShape,
    TrainerSetup,
    largest_fitting,
    table,
    trainer_memory,
)

ROOT = Path(__file__).resolve().parents[2]
# hidden 8, 2 layers, vocab 10, 2 heads of 4 (1 KV head), MLP 16: per block q 64 + k 32 +
# v 32 + o 64 + gate 128 + up 128 + down 128 + norms 16 = 592; embeddings 2 x 80; final norm 8
TINY = ModelShape(hidden=8, layers=2, vocab=10, heads=2, kv_heads=1, intermediate=16)
T = 5  # micro-batch tokens
ACTS = 34 * T * 8 * 2 + 12 * T * 10  # 34·T·h per layer + fp32 logits three times: 3320


def test_parameter_counts() -> None:
    assert TINY.block_params == 592 and TINY.params == 1352
    assert TINY.lora_params(2, ("q_proj", "v_proj")) == 2 * (2 * (8 + 8) + 2 * (8 + 4))
    # published sizes: Qwen2.5-7B 7.62B, Qwen2.5-0.5B 0.49B, Llama-3-70B 70.6B
    assert SIZES["7B"].params == pytest.approx(7.62e9, rel=0.01)
    assert SIZES["0.5B"].params == pytest.approx(0.494e9, rel=0.01)
    assert SIZES["70B"].params == pytest.approx(70.6e9, rel=0.01)
    cfg = {"hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 10,
           "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 16}
    assert ModelShape.from_config(cfg) == TINY


def test_full_fine_tuning_ddp_and_fsdp() -> None:
    ddp = trainer_memory(TINY, TrainerSetup(micro_batch_tokens=T))
    assert (ddp.states, ddp.working, ddp.activations) == (16 * 1352, 0, ACTS)
    assert ddp.device == 21632 + 3320
    fsdp = trainer_memory(TINY, TrainerSetup(parallel="fsdp", ranks=2, micro_batch_tokens=T))
    # ZeRO-3: states / N; two blocks gathered in bf16 with their bf16 gradients
    assert (fsdp.states, fsdp.working, fsdp.activations) == (10816, 2 * 592 * 2 * 2, ACTS)
    assert trainer_memory(7_000_000_000).states == 112_000_000_000  # 16 bytes a parameter
    assert trainer_memory(7_000_000_000, TrainerSetup(parallel="fsdp", ranks=8)).states == \
        14_000_000_000


def test_lora_offload_checkpointing_fp32() -> None:
    lora = trainer_memory(TINY, TrainerSetup(lora_r=2, lora_targets=("q_proj", "v_proj"),
                                             micro_batch_tokens=T))
    assert lora.trained == 112 and lora.states == 112 * 16 + 1352 * 2  # frozen base in bf16
    lora8 = trainer_memory(TINY, TrainerSetup(parallel="fsdp", ranks=8, lora_r=2,
                                              lora_targets=("q_proj", "v_proj"),
                                              micro_batch_tokens=T))
    assert lora8.states == -(-4496 // 8) and lora8.working == 2 * 592 * 2  # no base grads
    off = trainer_memory(TINY, TrainerSetup(parallel="fsdp", ranks=2, offload=True,
                                            micro_batch_tokens=T))
    assert (off.states, off.offloaded, off.device) == (0, 10816, 4736 + ACTS)
    ckpt = trainer_memory(TINY, TrainerSetup(micro_batch_tokens=T,
                                             activation_checkpointing=True))
    assert ckpt.activations == 2 * T * 8 * 2 + 34 * T * 8 + 12 * T * 10
    fp32 = trainer_memory(TINY, TrainerSetup(micro_batch_tokens=T, mixed_precision=False))
    assert fp32.activations == 2 * 34 * T * 8 * 2 + 12 * T * 10
    assert fp32.states == 16 * 1352
    with pytest.raises(ValueError, match="valid: ddp, fsdp"):
        trainer_memory(TINY, TrainerSetup(parallel="zero"))
    with pytest.raises(ValueError, match="FSDP"):
        trainer_memory(TINY, TrainerSetup(offload=True))


def test_largest_fitting_model() -> None:
    one = TrainerSetup(micro_batch_tokens=4096, activation_checkpointing=True)
    assert largest_fitting(80 * 10**9, one)[0] == "1.5B"  # ~4B is the limit of 16 bytes/param
    eight = TrainerSetup(parallel="fsdp", ranks=8, micro_batch_tokens=4096,
                         activation_checkpointing=True)
    # 32B: 16 x 32.8e9 / 8 = 65.5 GB of states alone, past 90% of 80 GB with the logits
    assert largest_fitting(80 * 10**9, eight)[0] == "14B"
    lora = TrainerSetup(parallel="fsdp", ranks=8, lora_r=16, micro_batch_tokens=4096,
                        activation_checkpointing=True)
    assert largest_fitting(80 * 10**9, lora)[0] == "70B"


def test_the_docs_table_is_current() -> None:
    out = subprocess.run([sys.executable, "-m", "astraflow.run.trainer_memory"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == table()
    assert table() in (ROOT / "docs" / "trainer.md").read_text(), \
        "docs/trainer.md's memory table is stale: paste `python -m astraflow.run.trainer_memory`"


def test_a_kl_reference_is_counted() -> None:
    """loss.kl holds a frozen fp32 copy of the model (sharded under fsdp); LoRA's reference
    is its own base, so nothing more."""
    full = trainer_memory(TINY, TrainerSetup(micro_batch_tokens=T, reference=True))
    assert full.states == 16 * 1352 + 4 * 1352
    fsdp = trainer_memory(TINY, TrainerSetup(parallel="fsdp", ranks=2, micro_batch_tokens=T,
                                             reference=True))
    assert fsdp.states == (16 + 4) * 1352 // 2
    lora = trainer_memory(TINY, TrainerSetup(lora_r=2, lora_targets=("q_proj", "v_proj"),
                                             micro_batch_tokens=T, reference=True))
    assert lora.states == 112 * 16 + 1352 * 2


def test_the_setup_is_read_from_the_config() -> None:
    """astraflow check's setup comes from trainer.parallel, trainer.fsdp.*, trainer.lora,
    loss.kl and launch.trainer_ranks."""
    from astraflow.config import ExperimentConfig
    from astraflow.run.memory import trainer_setup

    cfg = ExperimentConfig.model_validate({
        "run": "m", "models": {"default": {"build": "tiny-arith"}},
        "trainer": {"parallel": "fsdp", "micro_batch_tokens": 64,
                    "fsdp": {"cpu_offload": True, "activation_checkpointing": True},
                    "loss": {"kl": "k3", "kl_coef": 0.01}},
        "launch": {"trainer_ranks": 4}})
    assert trainer_setup(cfg, "default") == TrainerSetup(
        parallel="fsdp", ranks=4, micro_batch_tokens=64, offload=True,
        activation_checkpointing=True, reference=True, mixed_precision=False)  # default "no"
    plain = ExperimentConfig.model_validate({"run": "m",
                                             "models": {"default": {"build": "tiny-arith"}}})
    assert trainer_setup(plain, "default") == TrainerSetup(
        micro_batch_tokens=plain.trainer.micro_batch_tokens, mixed_precision=False)
