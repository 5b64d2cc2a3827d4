"""From a :class:`~astraflow.core.records.Batch` record to padded micro-batches of tensors.

:func:`prepare` unpacks the trajectories, computes group-relative advantages (per turn with
``turn_rewards``: :func:`turn_advantages`), optionally drops zero-advantage groups, and counts
the batch's *global* normalisers. :func:`micro_batches` packs sequences into micro-batches of at
most ``token_budget`` padded tokens, weighted by those counts so the micro-batch losses add up
to the batch's loss. Per-token arrays are shifted by one (logits at t - 1 predict token t).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from astraflow.consumers.trainer.advantages import batch_advantages, group_advantages
from astraflow.consumers.trainer.losses import token_weights
from astraflow.core.records import Batch, Trajectory, assistant_turns, unpack


@dataclass
class Seq:
    """One trajectory, cut after its last loss token."""

    token_ids: np.ndarray  # int32 [n]
    loss_mask: np.ndarray  # uint8 [n]
    logprobs: np.ndarray  # float32 [n], behaviour
    versions: np.ndarray  # int32 [n]
    advantage: float  # the sequence's (its first turn's, where its turns are scored apart)
    reward: float
    # per token [n], where the trajectory's turns have their own rewards
    # (``Trajectory.turn_rewards``); None: every token has ``advantage``
    token_adv: np.ndarray | None = None

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclass
class Prepared:
    """The trainable sequences of a batch and the batch's global normalisers."""

    seqs: list[Seq]
    n_tokens: int  # loss tokens in the whole batch (skipped groups included)
    n_seqs: int  # sequences with at least one loss token (skipped groups included)
    max_completion: int  # most loss tokens of any sequence
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [b, L] int64, right-padded
    attention_mask: torch.Tensor  # [b, L]
    targets: torch.Tensor  # [b, L-1] = input_ids[:, 1:]
    mask: torch.Tensor  # [b, L-1] bool
    behav: torch.Tensor  # [b, L-1] float32 behaviour logprobs
    versions: torch.Tensor  # [b, L-1] int32
    adv: torch.Tensor  # [b, L-1] float32, each token's advantage
    weights: torch.Tensor  # [b, L-1] float32, token weights with the batch's global counts

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())


def prepare(batch: Batch, *, advantages: bool = True, std_norm: bool = True,
            adv_eps: float = 1e-6, skip_zero: bool = False) -> Prepared:
    """Unpack ``batch``; with ``advantages``, compute them per group and (``skip_zero``)
    drop all-zero groups from the sequences returned, but not from the counts."""
    groups = [[t.reward for t in g.trajectories] for g in batch.groups]
    advs = (batch_advantages(groups, std_norm=std_norm, eps=adv_eps) if advantages
            else [torch.zeros(len(g)) for g in groups])
    # groups whose members score their turns apart: one advantage per member and turn
    turned = [turn_advantages(g.trajectories, std_norm=std_norm, eps=adv_eps)
              if advantages and any(t.turn_rewards for t in g.trajectories) else None
              for g in batch.groups]
    zeros = ([bool((a == 0).all()) if per is None else all(not p.any() for p in per)
              for a, per in zip(advs, turned, strict=True)] if advantages
             else [False] * len(groups))
    seqs: list[Seq] = []
    n_tokens = n_seqs = longest = 0
    skipped = 0
    flat_advs: list[torch.Tensor] = []
    for g, adv, per, is_zero in zip(batch.groups, advs, turned, zeros, strict=True):
        drop = skip_zero and is_zero
        skipped += drop
        if per is not None:
            adv = torch.tensor([float(p[0]) for p in per])
            flat_advs.append(torch.from_numpy(np.concatenate(per)))
        else:
            flat_advs.append(adv)
        for i, (t, a) in enumerate(zip(g.trajectories, adv.tolist(), strict=True)):
            mask = unpack(t.loss_mask, "u1").copy()
            mask[:1] = 0
            count = int(mask.sum())
            n_tokens += count
            n_seqs += count > 0
            longest = max(longest, count)
            if drop or count == 0:
                continue
            end = int(np.flatnonzero(mask)[-1]) + 1
            token_adv = None if per is None else per[i][turn_of_tokens(t)][:end]
            seqs.append(Seq(unpack(t.token_ids, "<i4")[:end], mask[:end],
                            unpack(t.logprobs, "<f4")[:end], unpack(t.versions, "<i4")[:end],
                            float(a), float(t.reward), token_adv))
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float64)
    flat = (torch.cat(flat_advs).double() if flat_advs
            else torch.zeros(0, dtype=torch.float64))
    stats = {
        "groups": float(len(groups)),
        "trajectories": float(rewards.numel()),
        "groups_zero_adv": float(sum(zeros)),
        "groups_skipped": float(skipped),
        "reward_mean": float(rewards.mean()) if rewards.numel() else 0.0,
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "adv_mean": float(flat.mean()) if flat.numel() else 0.0,
        "adv_std": float(flat.std()) if flat.numel() > 1 else 0.0,
        "adv_abs_mean": float(flat.abs().mean()) if flat.numel() else 0.0,
        "adv_max": float(flat.max()) if flat.numel() else 0.0,
        "adv_min": float(flat.min()) if flat.numel() else 0.0,
    }
    return Prepared(seqs, n_tokens, n_seqs, longest, stats)


def turn_advantages(members: Sequence[Trajectory], *, std_norm: bool = True,
                    eps: float = 1e-6) -> list[np.ndarray]:
    """Per member of one group, one advantage per assistant turn (float32 [turns], at least
    one entry): turn k is normalised among the members that have a k-th turn, by
    :func:`~astraflow.consumers.trainer.advantages.group_advantages` (a turn only one member
    reached has advantage 0). A member without ``turn_rewards`` has ``reward`` on every
    turn."""
    rewards = [list(t.turn_rewards) or [t.reward] * max(1, assistant_turns(t.spans))
               for t in members]
    out = [np.zeros(len(r), dtype=np.float32) for r in rewards]
    for k in range(max((len(r) for r in rewards), default=0)):
        having = [i for i, r in enumerate(rewards) if len(r) > k]
        adv = group_advantages(torch.tensor([rewards[i][k] for i in having],
                                            dtype=torch.float64), std_norm=std_norm, eps=eps)
        for i, a in zip(having, adv.tolist(), strict=True):
            out[i][k] = a
    return out


def turn_of_tokens(t: Trajectory) -> np.ndarray:
    """Each token's turn index (int [n]): the number of assistant spans starting at or before
    it, less one, at least 0 (tokens before the first assistant span belong to turn 0)."""
    starts = np.array([s.start for s in t.spans if s.role == "assistant"], dtype=np.int64)
    index = np.searchsorted(starts, np.arange(len(t.token_ids) // 4), side="right") - 1
    return np.maximum(index, 0)  # no assistant span: every token is turn 0


def pack(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices of sequences grouped into micro-batches of at most ``token_budget`` padded
    tokens (count × longest), longest first; a sequence longer than the budget goes alone.
    Deterministic: ties keep batch order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= token_budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def micro_batches(prep: Prepared, *, token_budget: int, aggregation: str = "token-mean",
                  norm_length: int | None = None, pad_id: int = 0,
                  device: torch.device | str = "cpu",
                  shard: tuple[int, int] = (0, 1)) -> list[MicroBatch]:
    """Padded micro-batches of ``prep``'s sequences with globally normalised token weights.
    ``shard = (rank, world)`` keeps every world-th micro-batch (data parallelism: every rank
    holds the whole batch, so the normalisers agree)."""
    result: list[MicroBatch] = []
    groups = pack([s.length for s in prep.seqs], token_budget)
    rank, world = shard
    for gi, idx in enumerate(groups):
        if gi % world != rank:
            continue
        seqs = [prep.seqs[i] for i in idx]
        width = max(s.length for s in seqs)
        ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
        att = np.zeros((len(seqs), width), dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=bool)
        behav = np.zeros((len(seqs), width), dtype=np.float32)
        vers = np.full((len(seqs), width), -1, dtype=np.int32)
        adv = np.zeros((len(seqs), width), dtype=np.float32)
        for row, s in enumerate(seqs):
            n = s.length
            ids[row, :n] = s.token_ids
            att[row, :n] = 1
            mask[row, :n] = s.loss_mask.astype(bool)
            behav[row, :n] = s.logprobs
            vers[row, :n] = s.versions
            adv[row, :n] = s.advantage if s.token_adv is None else s.token_adv
        t_mask = torch.from_numpy(mask[:, 1:])
        weights = token_weights(t_mask, aggregation, n_tokens=prep.n_tokens,
                                n_seqs=prep.n_seqs,
                                norm_length=norm_length or prep.max_completion)
        input_ids = torch.from_numpy(ids)
        result.append(MicroBatch(
            input_ids=input_ids.to(device), attention_mask=torch.from_numpy(att).to(device),
            targets=input_ids[:, 1:].to(device), mask=t_mask.to(device),
            behav=torch.from_numpy(behav[:, 1:]).to(device),
            versions=torch.from_numpy(vers[:, 1:]).to(device),
            adv=torch.from_numpy(adv[:, 1:]).to(device),
            weights=weights.float().to(device)))
    return result
