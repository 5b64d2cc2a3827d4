"""One RL optimizer step on one batch: advantages, micro-batched loss, gradient, update.

The trainer takes exactly one optimizer step per batch, so the forward already runs the
proximal policy π_prox of decoupled PPO: :func:`rl_step` takes ``logp.detach()`` from that
forward as π_prox, with no extra no-grad pass (docs/trainer.md). The model runs in eval mode
(no dropout) so that this equality is exact.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from astraflow.consumers.trainer import mismatch
from astraflow.consumers.trainer.batching import micro_batches, prepare
from astraflow.consumers.trainer.losses import policy_loss
from astraflow.consumers.trainer.sharding import filler_passes
from astraflow.consumers.trainer.state import TrainState, apply_gradients, forward, reference
from astraflow.core.records import Batch

_MAXED = ("behav_weight_max", "staleness_max", *mismatch.MAXED)
_SUMMED = ("loss", "pg_loss", "tokens", "clip_low", "clip_high", "dual_clip", "capped",
           "ratio_sum", "behav_weight_sum", "kl_sum", "entropy_sum", "staleness_sum",
           "padded_tokens", "seqs_trained", "micro_batches", *mismatch.SUMMED)


def rl_step(state: TrainState, batch: Batch, version: int) -> dict[str, float]:
    """Train on ``batch`` with the weights of ``version``; the result is ``version + 1``.
    Returns the step's metrics (means over the batch's loss tokens where per token)."""
    spec = state.spec
    gives_all_grad = spec.kl != "none" or spec.entropy_coef > 0
    prep = prepare(batch, advantages=True, std_norm=state.std_norm, adv_eps=state.adv_eps,
                   skip_zero=state.skip_zero and not gives_all_grad)
    mbs = micro_batches(prep, token_budget=state.token_budget, aggregation=spec.aggregation,
                        norm_length=spec.norm_length, pad_id=state.pad_id,
                        device=state.device, shard=(state.rank, state.world))
    entropy = ("grad" if spec.entropy_coef > 0 else
               "metric" if state.entropy_metric else "none")
    state.model.eval()
    totals: dict[str, float] = defaultdict(float)
    tally = mismatch.Tally(state.mismatch_threshold)
    for mb in mbs:
        logp, ent = forward(state, state.model, mb, entropy=entropy)
        ref = None
        if spec.kl != "none":
            with torch.no_grad(), reference(state) as ref_model:
                ref, _ = forward(state, ref_model, mb)
        out = policy_loss(logp, mb.behav, mb.adv, mb.mask, spec, ref_logp=ref, entropy=ent,
                          weights=mb.weights)
        out.loss.backward()
        totals["loss"] += float(out.loss.detach())
        for k, v in out.stats.items():
            if k in _MAXED:
                totals[k] = max(totals[k], v)
            else:
                totals[k] += v
        lag = (version - mb.versions)[mb.mask].double()
        tally.add(logp, mb.behav, mb.mask, mb.versions, version)
        if lag.numel():
            totals["staleness_sum"] += float(lag.sum())
            totals["staleness_max"] = max(totals["staleness_max"], float(lag.max()))
        totals["padded_tokens"] += mb.padded_tokens
        totals["seqs_trained"] += mb.input_ids.shape[0]
        totals["micro_batches"] += 1
    filler_passes(state, len(mbs), prep)
    totals.update(tally.totals())
    totals = _reduce(state, totals)
    metrics = dict(prep.stats)
    metrics.update(apply_gradients(state, version))
    n = max(totals.get("tokens", 0.0), 1.0)
    metrics.update({
        "loss": totals.get("loss", 0.0),
        "pg_loss": totals.get("pg_loss", 0.0),
        "tokens": totals.get("tokens", 0.0),
        "batch_tokens": float(prep.n_tokens),
        "padded_tokens": totals.get("padded_tokens", 0.0),
        "seqs_trained": totals.get("seqs_trained", 0.0),
        "micro_batches": totals.get("micro_batches", 0.0),
        "clip_frac": (totals.get("clip_low", 0.0) + totals.get("clip_high", 0.0)) / n,
        "clip_low_frac": totals.get("clip_low", 0.0) / n,
        "clip_high_frac": totals.get("clip_high", 0.0) / n,
        "dual_clip_frac": totals.get("dual_clip", 0.0) / n,
        "capped_frac": totals.get("capped", 0.0) / n,
        "ratio_mean": totals.get("ratio_sum", 0.0) / n if totals.get("tokens") else 1.0,
        "behav_weight_mean": (totals.get("behav_weight_sum", 0.0) / n
                              if totals.get("tokens") else 1.0),
        "behav_weight_max": totals.get("behav_weight_max", 0.0),
        "staleness_mean": totals.get("staleness_sum", 0.0) / n,
        "staleness_max": totals.get("staleness_max", 0.0),
    })
    metrics.update(mismatch.step_metrics(totals))
    if spec.kl != "none":
        metrics["kl"] = totals.get("kl_sum", 0.0) / n
    if entropy != "none":
        metrics["entropy"] = totals.get("entropy_sum", 0.0) / n
    return metrics


def _reduce(state: TrainState, totals: dict[str, float]) -> dict[str, float]:
    """Sum (max for maxima) the per-rank totals across data-parallel ranks."""
    if state.world == 1:
        return dict(totals)
    import torch.distributed as dist

    summed = torch.tensor([totals.get(k, 0.0) for k in _SUMMED], dtype=torch.float64,
                          device=state.device)
    maxed = torch.tensor([totals.get(k, 0.0) for k in _MAXED], dtype=torch.float64,
                         device=state.device)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
    return {**dict(zip(_SUMMED, summed.tolist(), strict=True)),
            **dict(zip(_MAXED, maxed.tolist(), strict=True))}
