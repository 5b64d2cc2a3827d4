"""Group-relative advantages (GRPO and Dr. GRPO), from the group structure of a batch.

For a group of n trajectories of one prompt with rewards r_1..r_n:

    A_i = r_i - mean(r)                         std_norm = false  (Dr. GRPO)
    A_i = (r_i - mean(r)) / (std(r) + eps)      std_norm = true   (GRPO)

``std`` is the unbiased sample std (n - 1), as in GRPO's reference code; a group of one has
advantage 0, and so does a group whose rewards are all equal. Pure torch functions: no bus, no model.

A group is one ``Group`` of a batch, i.e. one TrajectoryGroup of the assembler: one (policy,
agent, task attempt). A policy playing two roles of a workflow (solver and verifier) has one
group per role, so its advantages are agent-wise (each role against its own baseline).
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
