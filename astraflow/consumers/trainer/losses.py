"""The GRPO-family policy loss with every switch, the SFT loss, and token logprobs.

Per token, with ``A`` its advantage, ``r = π_θ / π_prox`` (decoupled) and ``w`` the capped
behaviour weight ``π_prox / π_behav`` (no gradient)::

    pg = w · max(-A·r, -A·clip(r, 1 - eps_low, 1 + eps_high))
    L  = pg + kl_coef · KL(π_θ, π_ref) - entropy_coef · H(π_θ)

The loss is Σ L·ω with the weights of :func:`token_weights`: given the batch's global counts,
micro-batch losses add up to the batch's loss. Every switch: docs/trainer.md#the-rl-loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS = ("none", "k1", "k3")
CAP_MODES = ("clip", "mask", "mask_both")
LEVELS = ("token", "sequence", "geometric")


@dataclass(frozen=True)
class LossSpec:
    """The loss switches as plain values (built from ``trainer.loss``)."""

    aggregation: str = "token-mean"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    kl: str = "none"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    decoupled: bool = True
    behaviour_cap: float | None = None
    behaviour_cap_mode: str = "clip"
    behaviour_level: str = "token"
    norm_length: int | None = None

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {self.aggregation!r}; valid: "
                             f"{', '.join(AGGREGATIONS)}")
        if self.kl not in KL_KINDS:
            raise ValueError(f"unknown kl {self.kl!r}; valid: {', '.join(KL_KINDS)}")
        if self.behaviour_cap_mode not in CAP_MODES:
            raise ValueError(f"unknown behaviour_cap_mode {self.behaviour_cap_mode!r}; "
                             f"valid: {', '.join(CAP_MODES)}")
        if self.behaviour_level not in LEVELS:
            raise ValueError(f"unknown behaviour_level {self.behaviour_level!r}; valid: "
                             f"{', '.join(LEVELS)}")
        if (self.behaviour_cap_mode == "mask_both" and self.behaviour_cap is not None
                and self.behaviour_cap <= 1):
            raise ValueError("behaviour_cap_mode mask_both keeps w in [1/cap, cap]: the cap "
                             f"must be > 1, got {self.behaviour_cap}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")


@dataclass
class LossOutput:
    """The scalar loss of (a micro-batch of) a batch and token-summed statistics."""

    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0
                   ) -> torch.Tensor:
    """log π(target) per position from ``logits`` [B, T, V] (already aligned: logits[:, t]
    predict targets[:, t]) at sampling temperature ``temperature``: the rollout sampled from
    softmax(logits / T) and recorded that logprob, so the trainer must divide by the same T
    for π_θ/π_behav to compare like with like. float32, via logsumexp (no full log-softmax
    is materialised for the gather)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse


def token_entropy(logits: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """Entropy H = logsumexp(z) - Σ softmax(z)·z of each position's distribution at
    temperature ``temperature`` (z = logits / T)."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(-1)


def token_weights(mask: torch.Tensor, aggregation: str, *, n_tokens: float | None = None,
                  n_seqs: float | None = None, norm_length: float | None = None
                  ) -> torch.Tensor:
    """Per-token weights ω (float64) with loss = Σ L·ω for ``aggregation`` over ``mask``
    [B, T].

    ``n_tokens`` (token-mean), ``n_seqs`` and ``norm_length`` (the seq-mean modes) are the
    counts of the whole batch; absent, they are taken from ``mask`` itself. Sequences with no
    loss token count for nothing."""
    m = mask.to(torch.float64)
    per_seq = m.sum(-1)
    if aggregation == "token-mean":
        total = float(per_seq.sum()) if n_tokens is None else float(n_tokens)
        w = m / max(total, 1.0)
    elif aggregation == "seq-mean-token-mean":
        seqs = float((per_seq > 0).sum()) if n_seqs is None else float(n_seqs)
        w = m / per_seq.clamp(min=1.0).unsqueeze(-1) / max(seqs, 1.0)
    elif aggregation == "seq-mean-token-sum-norm":
        seqs = float((per_seq > 0).sum()) if n_seqs is None else float(n_seqs)
        length = float(per_seq.max()) if norm_length is None else float(norm_length)
        w = m / (max(length, 1.0) * max(seqs, 1.0))
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}; valid: {', '.join(AGGREGATIONS)}")
    return w


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of π_θ from π_ref (Schulman's k1 / k3)."""
    if kind == "k1":
        return logp - ref_logp
    if kind == "k3":
        d = ref_logp - logp
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown kl {kind!r}; valid: k1, k3")


def policy_loss(logp: torch.Tensor, behav: torch.Tensor, adv: torch.Tensor,
                mask: torch.Tensor, spec: LossSpec, *, prox: torch.Tensor | None = None,
                ref_logp: torch.Tensor | None = None, entropy: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> LossOutput:
    """The RL loss of :mod:`this module <astraflow.consumers.trainer.losses>`'s docstring.

    ``logp`` [B, T] carries the gradient; ``behav`` the rollout's logprobs; ``adv`` per
    sequence [B] or per token [B, T]; ``mask`` 0/1 [B, T]. ``prox`` defaults to
    ``logp.detach()`` (one optimizer step per batch: the parameters before the update *are*
    the proximal policy). ``weights`` default to :func:`token_weights` of ``mask``."""
    keep = mask.bool()
    fmask = keep.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(logp)
    adv = adv.to(logp.dtype)
    if weights is None:
        weights = token_weights(keep, spec.aggregation, norm_length=spec.norm_length)
    weights = weights.to(logp.dtype)
    zero = torch.zeros_like(logp)
    behav = behav.to(logp.dtype)
    if spec.decoupled:
        base = (logp.detach() if prox is None else prox.to(logp.dtype))
        log_w = torch.where(keep, base - behav, zero)
        if spec.behaviour_level == "sequence":
            log_w = torch.where(keep, log_w.sum(-1, keepdim=True).expand_as(log_w), zero)
        elif spec.behaviour_level == "geometric":
            n = keep.sum(-1, keepdim=True).clamp(min=1).to(log_w.dtype)
            log_w = torch.where(keep, (log_w.sum(-1, keepdim=True) / n).expand_as(log_w), zero)
        bw = torch.exp(log_w.clamp(max=60.0))  # a product of many ratios may overflow
        capped = torch.zeros_like(keep)
        if spec.behaviour_cap is not None:
            capped = keep & (bw > spec.behaviour_cap)
            if spec.behaviour_cap_mode == "mask_both":
                capped = capped | (keep & (bw < 1.0 / spec.behaviour_cap))
            if spec.behaviour_cap_mode == "clip":
                bw = bw.clamp(max=spec.behaviour_cap)
            else:
                bw = torch.where(capped, zero, bw)
        bw = bw.detach() * fmask
    else:
        base = behav
        bw = fmask
        capped = torch.zeros_like(keep)
    ratio = torch.exp(torch.where(keep, logp - base, zero))
    clipped = ratio.clamp(1.0 - spec.eps_low, 1.0 + spec.eps_high)
    pg1 = -adv * ratio
    pg2 = -adv * clipped
    pg = torch.maximum(pg1, pg2)
    active = keep & (pg2 > pg1).detach()
    dual = torch.zeros_like(keep)
    if spec.dual_clip is not None:
        bound = -spec.dual_clip * adv
        dual = keep & (adv < 0) & (bound < pg).detach()
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    pg = pg * bw
    per_token = pg
    kl = None
    if spec.kl != "none":
        if ref_logp is None:
            raise ValueError(f"kl={spec.kl} needs ref_logp")
        kl = kl_penalty(logp, torch.where(keep, ref_logp.to(logp.dtype), logp.detach()),
                        spec.kl)
        per_token = per_token + spec.kl_coef * kl
    if spec.entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the entropy")
        per_token = per_token - spec.entropy_coef * entropy
    loss = (per_token * weights * fmask).sum()
    with torch.no_grad():
        stats = {
            "tokens": float(fmask.sum()),
            "pg_loss": float((pg * weights * fmask).sum()),
            "clip_low": float((active & (ratio < 1)).sum()),
            "clip_high": float((active & (ratio > 1)).sum()),
            "dual_clip": float(dual.sum()),
            "capped": float(capped.sum()),
            "ratio_sum": float((ratio * fmask).sum()),
            "behav_weight_sum": float((bw * fmask).sum()),
            "behav_weight_max": float(torch.where(keep, bw, zero).max()) if keep.any() else 0.0,
        }
        if kl is not None:
            stats["kl_sum"] = float((kl * fmask).sum())
        if entropy is not None:
            stats["entropy_sum"] = float((entropy * fmask).sum())
    return LossOutput(loss, stats)


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, *, weights: torch.Tensor | None = None
             ) -> LossOutput:
    """Cross-entropy on the masked tokens: -Σ log π(token)·ω, token-mean by default (with
    the batch's global token count in ``weights`` for micro-batches)."""
    keep = mask.bool()
    if weights is None:
        weights = token_weights(keep, "token-mean")
    fmask = keep.to(logp.dtype)
    nll = -torch.where(keep, logp, torch.zeros_like(logp))
    loss = (nll * weights.to(logp.dtype) * fmask).sum()
    return LossOutput(loss, {"tokens": float(fmask.sum()),
                             "nll_sum": float(nll.detach().sum())})
