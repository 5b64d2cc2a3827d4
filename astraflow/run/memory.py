"""A rough memory estimate of one policy's trainer and engines, from the model's config.json
and the run's settings (for `astraflow check`; no torch).

Trainer: per rank as :func:`astraflow.run.trainer_memory.trainer_memory` computes it, plus the
bf16 snapshot the publisher encodes from, times the ranks on the host. Engine: the weights in
``rollout.engine.dtype`` plus the KV cache of a full batch. Meant to catch order-of-magnitude
mistakes (a 7B model on a 16 GiB host), not to plan a cluster (docs/check.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from astraflow.run.trainer_memory import (
    ALL_LINEAR,
    ModelShape,
    TrainerMemory,
    TrainerSetup,
    gib,
    largest_fitting,
    trainer_memory,
)

if TYPE_CHECKING:
    from astraflow.config import ExperimentConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
#: prompt tokens assumed for the engine's KV cache
PROMPT_TOKENS = 256


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    trainer_bytes: int
    engine_bytes: int
    workers: int
    evaluator_bytes: int
    device: str
    trainer_rank: TrainerMemory | None = None  # one trainer rank's bytes
    setup: TrainerSetup | None = None

    @property
    def host_bytes(self) -> int:
        """What the run's roles on this host hold together (`astraflow run`: one trainer, the
        launched rollout workers, an evaluator)."""
        return self.trainer_bytes + self.workers * self.engine_bytes + self.evaluator_bytes

    def available_bytes(self) -> int | None:
        """This host's memory when the roles run on its CPU; None on a GPU (not known here)."""
        if self.device != "cpu":
            return None
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None

    def describe(self) -> str:
        gib = 2**30
        return (f"{self.params / 1e6:.1f}M parameters; about {self.trainer_bytes / gib:.2f} GiB "
                f"for the trainer, {self.engine_bytes / gib:.2f} GiB per engine "
                f"(x{self.workers} workers), {self.evaluator_bytes / gib:.2f} GiB for the "
                f"evaluator ({self.device})")


def run_host_bytes(estimates: Sequence[MemoryEstimate], *, team_evaluator: bool) -> int:
    """What the roles of a run of several policies hold together on one host (one
    :class:`MemoryEstimate` a policy): each policy's trainer and evaluator, every rollout
    worker an engine of each policy (a worker hosts them all), and with ``team_evaluator``
    one more evaluator holding every policy's model."""
    workers = max((e.workers for e in estimates), default=0)
    evaluators = sum(e.evaluator_bytes for e in estimates)
    return (sum(e.trainer_bytes for e in estimates)
            + workers * sum(e.engine_bytes for e in estimates)
            + evaluators * (2 if team_evaluator else 1))


def estimate(cfg: dict[str, Any], config: ExperimentConfig, policy: str,
             params: int | None = None) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of ``policy`` under ``config``; ``params``: the exact
    count where known (the safetensors headers), else estimated from ``cfg``."""
    from astraflow.models.source import estimate_parameters

    params = params or estimate_parameters(cfg) or 0
    h = int(cfg.get("hidden_size") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or (h // max(1, heads)))
    setup = trainer_setup(config, policy)
    rank = trainer_memory(ModelShape.from_config(cfg), setup, params=params)
    # every rank, plus the bf16 snapshot the publisher encodes from (its shard under fsdp)
    snapshot = params * 2 // (setup.ranks if setup.parallel == "fsdp" else 1)
    trainer = setup.ranks * (rank.device + rank.offloaded + snapshot)
    ec = config.rollout.engine
    wbytes = DTYPE_BYTES[ec.dtype]
    context = int(cfg.get("max_position_embeddings") or PROMPT_TOKENS + ec.max_new_tokens)
    seq = min(context, PROMPT_TOKENS + ec.max_new_tokens)
    kv_cache = 2 * layers * kv * head_dim * wbytes * seq * ec.max_batch_size
    engine = params * wbytes + kv_cache
    if policy in ec.adapters and policy != ec.adapters[0]:
        # a LoRA slot of the engine the first adapter policy is counted with (one base, one
        # KV cache for the batch of every adapter); the slot's matrices are under 1% of it
        engine = 0
    evaluator = params * 4 + 2 * layers * kv * head_dim * 4 * seq * 256 \
        if config.launch.evaluate else 0
    tc = config.trainer_for(policy)
    device = "cpu" if ec.device == "cpu" and tc.device in ("cpu", "auto") else "cuda"
    return MemoryEstimate(params, trainer, engine, config.launch.rollout_workers, evaluator,
                          device, rank, setup)


def trainer_setup(config: ExperimentConfig, policy: str) -> TrainerSetup:
    """The :class:`TrainerSetup` of ``policy``'s trainer. Keys a build may not have yet
    (``trainer.parallel``, ``trainer.lora``, ``launch.trainer_ranks``, offload, activation
    checkpointing) are read with their defaults: ddp, no LoRA, 1 rank, off."""
    tc = config.trainer_for(policy)
    lora = getattr(tc, "lora", None)
    if isinstance(lora, dict):
        r, targets = lora.get("r"), lora.get("target_modules")
    else:
        r, targets = getattr(lora, "r", None), getattr(lora, "target_modules", None)
    if isinstance(targets, str) or not targets:  # "all-linear" (peft's), or absent
        targets = ALL_LINEAR
    known = tuple(t for t in targets if t in ALL_LINEAR) or ALL_LINEAR
    fsdp = getattr(tc, "fsdp", None)  # trainer.fsdp: offload and activation checkpointing
    return TrainerSetup(
        parallel=str(getattr(tc, "parallel", "ddp") or "ddp"),
        ranks=int(getattr(config.launch, "trainer_ranks", 1) or 1),
        mixed_precision=tc.mixed_precision != "no",
        lora_r=int(r) if r else None, lora_targets=known,
        offload=bool(getattr(fsdp, "cpu_offload", False)),
        micro_batch_tokens=tc.micro_batch_tokens,
        activation_checkpointing=bool(getattr(fsdp, "activation_checkpointing", False)),
        reference=tc.mode == "rl" and tc.loss.kl != "none")


def describe_trainer(est: MemoryEstimate, gpu_gb: float) -> str:
    """One line for `astraflow check`: a trainer rank's bytes and the largest model of the
    docs' table that fits a GPU of ``gpu_gb`` GB under the same setup."""
    rank, setup = est.trainer_rank, est.setup
    assert rank is not None and setup is not None
    lora = f"LoRA r={setup.lora_r}" if setup.lora_r else "full"
    text = (f"trainer ({setup.parallel}, {setup.ranks} rank{'s' * (setup.ranks > 1)}, {lora}"
            f"{', offload' if setup.offload else ''}): {gib(rank.device)} GiB per rank on the "
            f"device (states {gib(rank.states)}, working set {gib(rank.working)}, activations "
            f"{gib(rank.activations)} for {setup.micro_batch_tokens} tokens)")
    if rank.offloaded:
        text += f", {gib(rank.offloaded)} GiB per rank in host memory"
    best = largest_fitting(int(gpu_gb * 1e9), setup)
    return text + (f"; the largest model of the docs' table that fits a {gpu_gb:g} GB GPU so: "
                   f"{best[0]}" if best else f"; none of the docs' table fits {gpu_gb:g} GB")
