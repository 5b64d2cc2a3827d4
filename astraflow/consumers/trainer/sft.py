"""One SFT optimizer step: cross-entropy on the masked tokens of a batch of demonstrations.

Demonstrations travel as ordinary :class:`~astraflow.core.records.Batch` records: each
trajectory's ``loss_mask`` marks the tokens to learn (e.g. the answer), its ``logprobs`` and
``versions`` are ignored, and rewards do not matter. The loss is the token mean over the
batch's loss tokens (global count, so micro-batching does not change it).
"""

from __future__ import annotations

import math

import torch

from astraflow.consumers.trainer.batching import micro_batches, prepare
from astraflow.consumers.trainer.losses import sft_loss
from astraflow.consumers.trainer.sharding import filler_passes
from astraflow.consumers.trainer.state import TrainState, apply_gradients, forward
from astraflow.core.records import Batch


def sft_step(state: TrainState, batch: Batch, version: int) -> dict[str, float]:
    """Train on ``batch``; returns the step's metrics (``loss`` is the mean token NLL)."""
    prep = prepare(batch, advantages=False)
    mbs = micro_batches(prep, token_budget=state.token_budget, aggregation="token-mean",
                        pad_id=state.pad_id, device=state.device,
                        shard=(state.rank, state.world))
    state.model.train()
    totals = torch.zeros(4, dtype=torch.float64)  # loss, tokens, padded, micro-batches
    for mb in mbs:
        logp, _ = forward(state, state.model, mb)
        out = sft_loss(logp, mb.mask, weights=mb.weights)
        out.loss.backward()
        totals += torch.tensor([float(out.loss.detach()), out.stats["tokens"],
                                mb.padded_tokens, 1.0], dtype=torch.float64)
    filler_passes(state, len(mbs), prep)
    if state.world > 1:
        import torch.distributed as dist

        totals = totals.to(state.device)
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        totals = totals.cpu()
    loss, tokens, padded, n_mb = totals.tolist()
    metrics = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": tokens,
               "batch_tokens": float(prep.n_tokens), "padded_tokens": padded,
               "micro_batches": n_mb, "trajectories": prep.stats["trajectories"],
               "reward_mean": prep.stats["reward_mean"]}
    metrics.update(apply_gradients(state, version))
    return metrics
