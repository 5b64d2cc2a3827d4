"""Synthetic arithmetic: the held-out split never overlaps train, whatever the seed."""

from __future__ import annotations

import re

from astraflow.producers.arithmetic import arithmetic, problems, split_of
from astraflow.producers.config import ArithmeticConfig


def test_splits_are_disjoint_and_cover_everything() -> None:
    train = {(a, op, b) for a, op, b in problems(ArithmeticConfig(ops=["+", "*"], seed=1))}
    test = {(a, op, b) for a, op, b in problems(ArithmeticConfig(ops=["+", "*"], split="test",
                                                                 seed=2))}
    assert not train & test
    assert len(train) + len(test) == 2 * 100 * 100
    assert 0.03 < len(test) / (len(train) + len(test)) < 0.07  # test_fraction 0.05
    assert split_of("12+34", 0.05) == split_of("12+34", 0.05)


def test_seed_orders_and_answers_are_right() -> None:
    a = [s.id for s, _ in arithmetic(ArithmeticConfig(count=20, seed=0))]
    b = [s.id for s, _ in arithmetic(ArithmeticConfig(count=20, seed=0))]
    c = [s.id for s, _ in arithmetic(ArithmeticConfig(count=20, seed=1))]
    assert a == b and a != c
    for spec, _ in arithmetic(ArithmeticConfig(ops=["-", "*"], count=50, max_value=20)):
        match = re.fullmatch(r"(\d+)([-*])(\d+)=", spec.prompt[0].content)
        assert match is not None
        x, op, y = match.groups()
        want = int(x) - int(y) if op == "-" else int(x) * int(y)
        assert spec.reference == {"answer": str(want)}
        assert spec.id == f"arith/{spec.prompt[0].content.rstrip('=')}"


def test_count_beyond_the_split_repeats() -> None:
    cfg = ArithmeticConfig(max_value=3, test_fraction=0.0, count=40)  # 16 problems
    items = list(arithmetic(cfg))
    assert len(items) == 40
    assert [r for _, r in items] == [0] * 16 + [1] * 16 + [2] * 8
