"""Turns scored apart (``Trajectory.turn_rewards``): each turn is normalised within its group
among the members that have that turn, every token carries its turn's advantage into the
loss, and the record refuses a reward count that does not match its assistant turns."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from trainer_helpers import trajectory

from astraflow.consumers.trainer.batching import (
    micro_batches,
    prepare,
    turn_advantages,
    turn_of_tokens,
)
from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.errors import SchemaError
from astraflow.core.records import Batch, Group, Trajectory, TurnSpan, pack_u8

# prompt [0, 3), first answer [3, 5), the verdict (a user turn) [5, 7), the retry [7, 9)
IDS = [1, 5, 6, 7, 8, 9, 10, 11, 12]
TWO_TURNS = [TurnSpan(start=0, end=3, role="prompt"), TurnSpan(start=3, end=5, role="assistant"),
             TurnSpan(start=5, end=7, role="user"), TurnSpan(start=7, end=9, role="assistant")]


def member(tid: str, turns: list[float], *, reward: float | None = None) -> Trajectory:
    """A solver trajectory of one answer, or of an answer and a retry (``len(turns)``)."""
    n = 5 if len(turns) == 1 else 9
    t = trajectory(IDS[:n], 3, reward=turns[-1] if reward is None else reward, tid=tid)
    mask = [0, 0, 0, 1, 1] + ([0, 0, 1, 1] if n == 9 else [])
    return msgspec.structs.replace(t, loss_mask=pack_u8(mask),
                                   spans=TWO_TURNS if n == 9 else TWO_TURNS[:2],
                                   turn_rewards=turns)


def test_each_turn_is_normalised_among_the_members_that_have_it() -> None:
    members = [member("a", [1.0]), member("b", [0.0, 1.0]), member("c", [0.0, 0.0]),
               member("d", [0.0])]
    adv = turn_advantages(members, std_norm=False)
    # first turn: 1, 0, 0, 0 over all four; the retry: 1, 0 over the two that retried
    assert [a.tolist() for a in adv] == [[0.75], [-0.25, 0.5], [-0.25, -0.5], [-0.25]]
    normed = turn_advantages(members)
    assert normed[1][1] == pytest.approx(0.5 / np.std([1.0, 0.0], ddof=1), rel=1e-5)
    # a turn only one member reached teaches nothing
    lone = turn_advantages([member("a", [1.0]), member("b", [0.0, 1.0])], std_norm=False)
    assert lone[1].tolist() == [-0.5, 0.0]
    # a member without turn rewards has its reward on every turn
    plain = trajectory(IDS[:5], 3, reward=1.0, tid="p")
    assert turn_advantages([plain, member("b", [0.0])], std_norm=False)[0].tolist() == [0.5]
    assert turn_of_tokens(plain).tolist() == [0, 0, 0, 0, 0]  # no spans: all turn 0


def test_every_token_carries_its_turns_advantage() -> None:
    t = member("b", [0.0, 1.0])
    assert turn_of_tokens(t).tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    group = Group(group_id="g", task_id="t", trajectories=[
        member("a", [1.0]), t, member("c", [0.0, 0.0]), member("d", [0.0])])
    prep = prepare(Batch(id="b", policy="default", seq=0, groups=[group]), std_norm=False)
    assert [s.advantage for s in prep.seqs] == [0.75, -0.25, -0.25, -0.25]  # the first turn's
    assert prep.seqs[1].token_adv.tolist()[3:] == [-0.25, -0.25, -0.25, -0.25, 0.5, 0.5]
    (mb,) = micro_batches(prep, token_budget=1000)
    # the trained tokens of each row (rows are in packing order, longest first)
    trained = sorted(mb.adv[r][mb.mask[r]].tolist() for r in range(mb.adv.shape[0]))
    assert trained == sorted([[0.75, 0.75], [-0.25, -0.25, 0.5, 0.5],
                              [-0.25, -0.25, -0.5, -0.5], [-0.25, -0.25]])


def test_a_group_is_skipped_only_when_every_turn_is_flat() -> None:
    varied_retry = Group(group_id="g", task_id="t", trajectories=[
        member("a", [0.0, 1.0]), member("b", [0.0, 0.0])])  # first answers equal, retries not
    flat = Group(group_id="h", task_id="t", trajectories=[
        member("c", [0.0, 1.0]), member("d", [0.0, 1.0])])
    prep = prepare(Batch(id="b", policy="default", seq=0, groups=[varied_retry, flat]),
                   skip_zero=True)
    assert prep.stats["groups_zero_adv"] == 1.0 and prep.stats["groups_skipped"] == 1.0
    assert len(prep.seqs) == 2 and prep.n_seqs == 4  # the flat group still counts


def test_the_loss_trains_each_turn_by_its_own_advantage(tiny_dir: Path) -> None:
    """One SGD step on a batch whose first answers are flat and whose retries differ: the
    gradient is that of the retries alone (the first answers' tokens have advantage 0)."""
    def step(batch: Batch) -> dict[str, torch.Tensor]:
        e = build_train_state(TrainerConfig.model_validate({"device": "cpu"}), tiny_dir)
        e.optimizer = torch.optim.SGD(e.model.parameters(), lr=1.0)
        e.lr, e.grad_clip = 1.0, None
        before = {k: v.detach().clone() for k, v in e.model.state_dict().items()}
        rl_step(e, batch, 0)
        return {k: v.detach() - before[k] for k, v in e.model.state_dict().items()}

    turned = Batch(id="b", policy="default", seq=0, groups=[Group(
        group_id="g", task_id="t", trajectories=[member("a", [0.0, 1.0]),
                                                 member("b", [0.0, 0.0])])])
    moved = step(turned)
    assert any(d.abs().max() > 0 for d in moved.values())
    # the same batch with the first answers' tokens untrained: the same update
    retries_only = Batch(id="b", policy="default", seq=0, groups=[Group(
        group_id="g", task_id="t", trajectories=[
            msgspec.structs.replace(t, loss_mask=pack_u8([0] * 7 + [1, 1]), turn_rewards=[],
                                    reward=t.turn_rewards[1])
            for t in turned.groups[0].trajectories])])
    same = step(retries_only)
    # token-mean over 8 loss tokens against 4: half the step, the same direction
    for k in moved:
        assert torch.allclose(moved[k], same[k] / 2, rtol=1e-4, atol=1e-8), k


def test_a_turn_reward_count_that_does_not_match_the_turns_is_refused() -> None:
    with pytest.raises(SchemaError, match="turn_rewards has 1 entries, spans have 2"):
        msgspec.structs.replace(member("b", [0.0, 1.0]), turn_rewards=[1.0]).__post_init__()
    t = member("b", [0.0, 1.0])
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(t), type=Trajectory)
    assert back.turn_rewards == [0.0, 1.0]
