"""Group-relative advantages (GRPO and Dr. GRPO), from the group structure of a batch.

For a group of n trajectories with rewards r_1..r_n, ``A_i = r_i - mean(r)`` with
``std_norm: false`` (Dr. GRPO), else ``(r_i - mean(r)) / (std(r) + eps)`` (GRPO, unbiased
std); a group of one, or of equal rewards, has advantage 0. A group is one (policy, agent, task
attempt), so each role a policy plays has its own baseline. Pure torch: no bus, no model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(rewards: torch.Tensor, *, std_norm: bool = True, eps: float = 1e-6
                     ) -> torch.Tensor:
    """Advantages of one group's rewards (1-D tensor)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards of one group must be 1-D, got shape {tuple(rewards.shape)}")
    if rewards.numel() < 2 or bool((rewards == rewards[0]).all()):
        # exactly zero (a float mean of equal values need not equal them)
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    if not std_norm:
        return centred
    return centred / (rewards.std(unbiased=True) + eps)


def batch_advantages(groups: Sequence[Sequence[float]], *, std_norm: bool = True,
                     eps: float = 1e-6, dtype: torch.dtype = torch.float32
                     ) -> list[torch.Tensor]:
    """Advantages of every group of a batch: one tensor per group, aligned with its rewards.

    Rewards are combined in float64 and cast to ``dtype`` at the end, so the result does not
    depend on how large the rewards are relative to their spread."""
    return [group_advantages(torch.tensor(list(g), dtype=torch.float64), std_norm=std_norm,
                             eps=eps).to(dtype) for g in groups]


def zero_groups(advantages: Sequence[torch.Tensor]) -> list[bool]:
    """Per group: whether every advantage is exactly zero (all rewards equal). The policy loss
    of such a group, and its gradient, are exactly zero."""
    return [bool((a == 0).all()) for a in advantages]
