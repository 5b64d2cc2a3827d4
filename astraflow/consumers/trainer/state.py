"""The trainable state of one policy and the parts of a step that RL and SFT share.

A :class:`TrainState` holds the model (fp32 master weights), the optimizer, the device, the
optional frozen reference model and the step settings; build one with
:func:`astraflow.consumers.trainer.build.build_train_state`. :func:`forward` computes a
micro-batch's token logprobs; :func:`apply_gradients` finishes a step: missing gradients become
zeros, gradients are summed across data-parallel ranks, clipped, and the optimizer steps. Data
parallelism and fsdp: docs/trainer.md#parallelism-ddp-and-fsdp.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from astraflow.consumers.trainer.batching import MicroBatch
from astraflow.consumers.trainer.losses import LossSpec, token_entropy, token_logprobs
from astraflow.core.records import AdapterSpec


@dataclass
class TrainState:
    """Model, optimizer and settings of a trainer; see the module docstring."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    mode: str = "rl"  # rl | sft
    spec: LossSpec = field(default_factory=LossSpec)
    temperature: float = 1.0
    token_budget: int = 8192
    grad_clip: float | None = 1.0
    lr: float = 3e-4
    warmup_steps: int = 0
    skip_zero: bool = True
    std_norm: bool = True
    adv_eps: float = 1e-6
    entropy_metric: bool = True
    ref_model: torch.nn.Module | None = None
    pad_id: int = 0
    autocast: Callable[[], Any] = contextlib.nullcontext
    rank: int = 0
    world: int = 1
    parallel: str = "ddp"  # ddp | fsdp (the model's parameters are DTensor shards)
    adapter: AdapterSpec | None = None  # trainer.lora: the model is a peft LoRA model
    mismatch_threshold: float = 0.5  # trainer.mismatch.token_threshold (mismatch.py)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def lr_at(self, version: int) -> float:
        """Constant lr after a linear warm-up; a function of the version only, so nothing
        about the schedule needs checkpointing."""
        if self.warmup_steps <= 0:
            return self.lr
        return self.lr * min(1.0, (version + 1) / self.warmup_steps)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The master weights by name (what checkpoints and the publisher get); whole tensors,
        with LoRA the adapter's only (:func:`.lora.adapter_tensors`). Under fsdp a collective:
        every rank must call it at the same point."""
        if self.adapter is not None:
            from astraflow.consumers.trainer.lora import adapter_tensors

            tensors = adapter_tensors(self.model)
            if self.parallel == "fsdp":
                from torch.distributed.tensor import DTensor

                tensors = {k: v.full_tensor() if isinstance(v, DTensor) else v
                           for k, v in tensors.items()}
            return tensors
        if self.parallel == "fsdp":
            from astraflow.consumers.trainer.sharding import full_state

            return full_state(self)
        return dict(self.model.state_dict())


@contextlib.contextmanager
def reference(state: TrainState) -> Iterator[torch.nn.Module]:
    """The frozen initial model the KL penalty compares with, for the ``with`` block: the
    reference copy (sharded like the model under fsdp), or with LoRA the model itself with its
    adapter switched off (the base: a fresh adapter adds zero, so the base is the initial
    policy, and no second copy is held)."""
    if state.ref_model is not None:
        yield state.ref_model
    elif state.adapter is not None:
        with state.model.disable_adapter():  # type: ignore[operator]
            yield state.model
    else:
        raise ValueError(f"loss.kl={state.spec.kl} needs a reference model")


def forward(state: TrainState, model: torch.nn.Module, mb: MicroBatch, *,
            entropy: str = "none") -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token logprobs [b, L-1] of ``mb``'s targets under ``model`` at the engine's sampling
    temperature, and the entropy per position: ``entropy`` is "none", "metric" (computed
    without a graph) or "grad" (part of the loss)."""
    with state.autocast():
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    logits = out.logits[:, :-1]
    logp = token_logprobs(logits, mb.targets, temperature=state.temperature)
    ent = None
    if entropy != "none":
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            ent = token_entropy(logits, temperature=state.temperature)
    return logp, ent


def apply_gradients(state: TrainState, version: int) -> dict[str, float]:
    """Zero-fill, all-reduce (sum), clip and apply the accumulated gradients; returns
    ``grad_norm`` (before clipping) and ``lr``."""
    params = state.params
    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    if state.world > 1 and state.parallel != "fsdp":  # fsdp summed in the backward
        import torch.distributed as dist

        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n
    max_norm = state.grad_clip if state.grad_clip is not None else math.inf
    if state.parallel == "fsdp":
        from astraflow.consumers.trainer.sharding import clip_grad_norm

        norm = clip_grad_norm(params, max_norm)
    else:
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    lr = state.lr_at(version)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    finite = math.isfinite(norm)
    if finite:
        state.optimizer.step()
    # A non-finite gradient (an overflow, a bad batch) is dropped rather than written into
    # the weights and the optimizer's moments; the step still counts, reported as skipped.
    state.optimizer.zero_grad(set_to_none=True)
    return {"grad_norm": norm, "lr": lr, "nonfinite_grad": float(not finite)}
