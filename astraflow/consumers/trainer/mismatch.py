"""Train–inference mismatch: how far the engine's token logprobs are from the trainer's.

``d = t − b`` for a token the engine sampled with logprob ``b`` and the trainer computes as
``t``. On a *fresh* token (:func:`fresh_tokens`: its reply sampled at the trainer's version up
to it) ``d`` measures the engine against the trainer alone; on a *stale* one it also holds the
policy's change. Each step reports ``mismatch_*_fresh`` and ``mismatch_*_stale``
(docs/trainer.md#train-inference-mismatch); :class:`Alarm` checks the fresh ones against
``trainer.mismatch``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from astraflow.consumers.trainer.config import MismatchConfig

KINDS = ("fresh", "stale")
#: per-rank sums and maxima, added to rl.py's reductions across ranks
SUMMED = tuple(f"mismatch_{s}_{k}" for k in KINDS for s in ("tokens", "k3_sum", "beyond_n"))
MAXED = tuple(f"mismatch_{s}_{k}" for k in KINDS for s in ("abs_max", "abs_p99"))


def fresh_tokens(mask: torch.Tensor, versions: torch.Tensor, version: int) -> torch.Tensor:
    """[B, T] bool: trained tokens sampled at ``version`` whose whole prefix was computed at
    ``version`` too — every trained token before them in the row has that version. An update
    can land between two decoding steps of a reply: the tokens after it carry the new version
    but were decoded over a KV cache of the old one, which the trainer's recompute at the new
    version does not reproduce; they count as stale."""
    off = mask & (versions != version)
    return mask & (versions == version) & (torch.cumsum(off.long(), dim=-1) == 0)


@dataclass
class Tally:
    """The |d| and k3 of every trained token of one step on this rank, by kind."""

    threshold: float
    absd: dict[str, list[torch.Tensor]] = field(
        default_factory=lambda: {k: [] for k in KINDS})
    k3: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    def add(self, logp: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor,
            versions: torch.Tensor, version: int) -> None:
        """One micro-batch: ``logp``, ``behav`` and ``versions`` (each token's weights
        version) [B, T], ``mask`` its trained tokens (bool), ``version`` the trainer's."""
        with torch.no_grad():
            d = (logp.detach().double() - behav.double())[mask]
            fresh = fresh_tokens(mask, versions, version)[mask]
            for kind, sel in (("fresh", fresh), ("stale", ~fresh)):
                x = d[sel]
                if x.numel():
                    self.absd[kind].append(x.abs())
                    self.k3[kind] += float((torch.expm1(x) - x).sum())

    def totals(self) -> dict[str, float]:
        """This rank's sums (:data:`SUMMED`) and maxima (:data:`MAXED`)."""
        out: dict[str, float] = {}
        for kind in KINDS:
            a = torch.cat(self.absd[kind]) if self.absd[kind] else torch.zeros(0,
                                                                               dtype=torch.float64)
            out[f"mismatch_tokens_{kind}"] = float(a.numel())
            out[f"mismatch_k3_sum_{kind}"] = self.k3[kind]
            out[f"mismatch_beyond_n_{kind}"] = float((a > self.threshold).sum())
            out[f"mismatch_abs_max_{kind}"] = float(a.max()) if a.numel() else 0.0
            out[f"mismatch_abs_p99_{kind}"] = (float(torch.quantile(a, 0.99)) if a.numel()
                                               else 0.0)
        return out


def step_metrics(totals: dict[str, float]) -> dict[str, float]:
    """The step's mismatch metrics from the (reduced) totals of :meth:`Tally.totals`."""
    out: dict[str, float] = {}
    for kind in KINDS:
        n = totals.get(f"mismatch_tokens_{kind}", 0.0)
        out[f"mismatch_tokens_{kind}"] = n
        if not n:
            continue
        out[f"mismatch_k3_{kind}"] = totals[f"mismatch_k3_sum_{kind}"] / n
        out[f"mismatch_beyond_{kind}"] = totals[f"mismatch_beyond_n_{kind}"] / n
        out[f"mismatch_abs_max_{kind}"] = totals[f"mismatch_abs_max_{kind}"]
        out[f"mismatch_abs_p99_{kind}"] = totals[f"mismatch_abs_p99_{kind}"]
    return out


@dataclass(frozen=True)
class Alarm:
    """``trainer.mismatch`` applied to a step's metrics."""

    max_k3: float | None
    max_beyond: float | None
    token_threshold: float
    stop: bool

    @classmethod
    def from_config(cls, cfg: MismatchConfig) -> Alarm | None:
        if cfg.max_k3 is None and cfg.max_beyond is None:
            return None
        return cls(cfg.max_k3, cfg.max_beyond, cfg.token_threshold, cfg.on_breach == "stop")

    def breaches(self, metrics: dict[str, float]) -> list[str]:
        """What the step's fresh tokens breach, in words (empty: nothing)."""
        out = []
        k3 = metrics.get("mismatch_k3_fresh")
        if self.max_k3 is not None and k3 is not None and k3 > self.max_k3:
            out.append(f"k3 {k3:.3g} > trainer.mismatch.max_k3 {self.max_k3:g}")
        beyond = metrics.get("mismatch_beyond_fresh")
        if self.max_beyond is not None and beyond is not None and beyond > self.max_beyond:
            out.append(f"{beyond:.1%} of tokens with |log ratio| > {self.token_threshold:g} > "
                       f"trainer.mismatch.max_beyond {self.max_beyond:g}")
        return out


def describe(step: int, policy: str, breaches: Iterable[str], metrics: dict[str, float]) -> str:
    """The warning line of a breach."""
    return (f"train-inference mismatch at step {step} ({policy}): " + "; ".join(breaches)
            + f" over {metrics.get('mismatch_tokens_fresh', 0):.0f} tokens sampled at the "
            "trainer's version (max |log ratio| "
            f"{metrics.get('mismatch_abs_max_fresh', 0.0):.3g}): the engine and the trainer "
            "disagree on the same weights (dtype, kernels, or the engine's weights)")
