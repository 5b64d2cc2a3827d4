"""A rough memory estimate of one policy's trainer and engines, from the model's config.json
and the run's settings (for `astraflow check`; no torch).

Trainer: fp32 master weights, gradients and AdamW's two moments (16 bytes a parameter), plus
activations of one micro-batch (``trainer.micro_batch_tokens`` tokens; ~34 bytes per token,
layer and hidden unit kept for the backward pass without recomputation in 16-bit training,
after Korthikanti et al. 2022, twice that in fp32), the micro-batch's logits in fp32 three
times over (logits, log-softmax, their gradient: a large vocabulary makes this the size of the
activations), and the bf16 snapshot the publisher encodes from.
Engine: the weights in ``rollout.engine.dtype``, plus the KV cache of a full batch
(``max_batch_size`` sequences of prompt + ``max_new_tokens``; the prompt taken as 256 tokens
unless the model's context is shorter). Rough estimates, to catch the order-of-magnitude
mistakes (a 7B model on a 16 GiB host), not to plan a cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from astraflow.config import ExperimentConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
#: prompt tokens assumed for the engine's KV cache
PROMPT_TOKENS = 256
#: activation bytes kept per token, layer and hidden unit for the backward pass (16-bit)
ACT_PER_TOKEN = 34


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    trainer_bytes: int
    engine_bytes: int
    workers: int
    evaluator_bytes: int
    device: str

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


def estimate(cfg: dict[str, Any], config: ExperimentConfig, policy: str,
             params: int | None = None) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of ``policy`` under ``config``; ``params``: the exact
    count where known (the safetensors headers), else estimated from ``cfg``."""
    from astraflow.models.source import estimate_parameters

    params = params or estimate_parameters(cfg) or 0
    vocab = int(cfg.get("vocab_size") or 0)
    h = int(cfg.get("hidden_size") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or 1)
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or (h // max(1, heads)))
    tc = config.trainer_for(policy)
    act_scale = 1 if tc.mixed_precision != "no" else 2
    trainer = (params * (16 + 2)
               + tc.micro_batch_tokens * layers * h * ACT_PER_TOKEN * act_scale
               + tc.micro_batch_tokens * vocab * 4 * 3)
    ec = config.rollout.engine
    wbytes = DTYPE_BYTES[ec.dtype]
    context = int(cfg.get("max_position_embeddings") or PROMPT_TOKENS + ec.max_new_tokens)
    seq = min(context, PROMPT_TOKENS + ec.max_new_tokens)
    kv_cache = 2 * layers * kv * head_dim * wbytes * seq * ec.max_batch_size
    engine = params * wbytes + kv_cache
    evaluator = params * 4 + 2 * layers * kv * head_dim * 4 * seq * 256 \
        if config.launch.evaluate else 0
    device = "cpu" if ec.device == "cpu" and tc.device in ("cpu", "auto") else "cuda"
    return MemoryEstimate(params, trainer, engine, config.launch.rollout_workers, evaluator,
                          device)
