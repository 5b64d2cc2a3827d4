"""FSDP2 for the trainer (``trainer.parallel: fsdp``): shard, reduce, clip, gather.

:func:`shard_model` shards every transformer block, then the root, so each rank keeps 1/N of
the parameters and of AdamW's moments; gradients are summed across ranks, as under ddp.
Every rank runs the same number of passes (:func:`filler_passes` make up the difference),
:func:`clip_grad_norm` uses the global norm, and :func:`publish_weights` hands each rank's rows
to its sharded publisher (docs/trainer.md#parallelism-ddp-and-fsdp).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import TYPE_CHECKING, Any

import torch

from astraflow.core.errors import ConfigError

if TYPE_CHECKING:
    from astraflow.consumers.trainer.batching import Prepared
    from astraflow.consumers.trainer.config import FsdpConfig
    from astraflow.consumers.trainer.state import TrainState

log = logging.getLogger("astraflow.trainer")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# where Hugging Face causal LMs keep their decoder blocks (Llama, Qwen, Mistral, Gemma: the
# first; GPT-2 and friends: transformer.h; GPT-NeoX: gpt_neox.layers)
_BLOCK_PATHS = ("model.layers", "model.model.layers", "transformer.h", "gpt_neox.layers",
                "model.decoder.layers", "transformer.layers")


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: the first known layer list, else the ``ModuleList``
    holding the most parameters (the decoder stack of any architecture)."""
    for path in _BLOCK_PATHS:
        found: Any = model
        for part in path.split("."):
            found = getattr(found, part, None)
            if found is None:
                break
        if isinstance(found, torch.nn.ModuleList) and len(found):
            return list(found)
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        raise ConfigError(f"{type(model).__name__} has no ModuleList of transformer blocks "
                          "to shard; use trainer.parallel: ddp for this model")
    best = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(best)


def ensure_process_group(device: torch.device) -> None:
    """FSDP needs a process group even for one rank: a single-process one when nothing
    (torchrun / accelerate launch) has set it up."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def _checkpointed(block: torch.nn.Module) -> None:
    """Recompute ``block``'s forward in the backward (non-reentrant checkpoint). The block's
    own ``forward`` is wrapped, so FSDP's hooks (on the module call) stay outside the
    recomputed region, as torchtitan's checkpoint-then-shard order has them."""
    from torch.utils.checkpoint import checkpoint

    inner = block.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward


def shard_model(model: torch.nn.Module, fc: FsdpConfig, device: torch.device, *,
                frozen: bool = False) -> Any:
    """Shard ``model`` in place (blocks, then root); returns the device mesh. ``frozen``: a
    model that only runs forwards without a graph (the KL reference): no activation
    checkpointing, and the root is freed after its forward too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    ensure_process_group(device)
    import torch.distributed as dist

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[fc.param_dtype],
                              reduce_dtype=DTYPES[fc.reduce_dtype])
    # pinned host memory speeds the copies to a GPU; without one there is nothing to pin
    # (and pinning needs a CUDA driver: a CPU-only host would fail at the first shard)
    offload = (CPUOffloadPolicy(pin_memory=device.type == "cuda") if fc.cpu_offload
               else OffloadPolicy())
    blocks = transformer_blocks(model)
    for block in blocks:
        if fc.activation_checkpointing and not frozen:
            _checkpointed(block)
        fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload,
                    reshard_after_forward=fc.reshard_after_forward)
    # the root holds the embeddings, the final norm and the (possibly tied) head; it is
    # needed again first in the backward, so it stays gathered after the forward
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload,
                reshard_after_forward=frozen)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # a sum, not FSDP's mean (see the module docstring)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    log.info("fsdp: %d blocks + root of the %s sharded over %d ranks param_dtype=%s "
             "reduce_dtype=%s cpu_offload=%s activation_checkpointing=%s", len(blocks),
             "reference" if frozen else "model", mesh.size(),
             fc.param_dtype, fc.reduce_dtype, fc.cpu_offload, fc.activation_checkpointing)
    return mesh


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_numel(model: torch.nn.Module) -> int:
    """Elements of the parameters this rank holds (its shards under fsdp)."""
    from torch.distributed.tensor import DTensor

    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel()
               for p in model.parameters())


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Total 2-norm of the gradients over every rank's shards; clips them to ``max_norm``
    (every rank gets the same norm, so all skip or all step)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)


def filler_passes(state: TrainState, done: int, prep: Prepared) -> None:
    """Run the forwards and backwards this rank lacks (it ran ``done``) so that every rank
    runs ``ceil(micro-batches / world)`` of them (fsdp only; see the module docstring)."""
    if state.parallel != "fsdp" or state.world == 1:
        return
    from astraflow.consumers.trainer.batching import pack
    from astraflow.consumers.trainer.state import reference

    total = len(pack([s.length for s in prep.seqs], state.token_budget))
    for _ in range(-(-total // state.world) - done):
        ids = torch.full((1, 2), state.pad_id, dtype=torch.long, device=state.device)
        with state.autocast():
            out = state.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                               use_cache=False)
        if state.mode == "rl" and state.spec.kl != "none":  # its gathers too, in order
            with torch.no_grad(), reference(state) as ref, state.autocast():
                ref(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        (out.logits.float().sum() * 0.0).backward()


def full_state(state: TrainState) -> dict[str, torch.Tensor]:
    """Every weight by state-dict name as a whole tensor. Under fsdp a collective: every rank
    must call it at the same point (each gets the full tensors)."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v
            for k, v in state.model.state_dict().items()}


def publish_weights(state: TrainState, publisher: Any, version: int) -> None:
    """Hand ``version``'s weights to ``publisher``; every rank calls it. A sharded publisher
    (:class:`~astraflow.weights.sharded.ShardedPublisher`, ``sharded = True``) gets each
    rank's own shards and no rank gathers the model; any other publisher gets whole tensors
    (under fsdp gathered by every rank, a collective) and rank 0 publishes."""
    if getattr(publisher, "sharded", False):
        publisher.publish(state.model.state_dict(), version)
        return
    tensors = state.state_tensors()
    if state.rank == 0 and publisher is not None:
        publisher.publish(tensors, version)
