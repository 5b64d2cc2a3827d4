"""Group-relative advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from astraflow.consumers.trainer.advantages import batch_advantages, group_advantages, zero_groups


def test_grpo_std_normalised() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64), eps=0.0)
    # mean 0.5; unbiased std sqrt(4 · 0.25 / 3) = sqrt(1/3)
    expected = 0.5 / math.sqrt(1 / 3)
    assert adv.tolist() == pytest.approx([expected, -expected, -expected, expected])


def test_dr_grpo_mean_only() -> None:
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0]), std_norm=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_eps_in_denominator() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), eps=0.5)
    std = math.sqrt(0.5)
    assert adv.tolist() == pytest.approx([0.5 / (std + 0.5), -0.5 / (std + 0.5)])


def test_degenerate_groups_are_exactly_zero() -> None:
    assert group_advantages(torch.tensor([0.1, 0.1, 0.1])).tolist() == [0.0, 0.0, 0.0]
    assert group_advantages(torch.tensor([7.0])).tolist() == [0.0]
    advs = batch_advantages([[0.1, 0.1, 0.1], [1.0, 0.0], [5.0]])
    assert zero_groups(advs) == [True, False, True]
    assert [a.dtype for a in advs] == [torch.float32] * 3


def test_batch_advantages_are_per_group() -> None:
    advs = batch_advantages([[1.0, 0.0], [10.0, 30.0, 20.0]], std_norm=False)
    assert advs[0].tolist() == pytest.approx([0.5, -0.5])
    assert advs[1].tolist() == pytest.approx([-10.0, 10.0, 0.0])


def test_large_rewards_keep_precision() -> None:
    adv = batch_advantages([[1e8 + 1.0, 1e8 - 1.0]], eps=0.0)[0]
    assert adv.tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-6)


def test_rejects_non_1d() -> None:
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2))
