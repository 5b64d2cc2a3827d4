"""Batching and whole optimizer steps on the tiny model: micro-batching and skipping
zero-advantage groups change nothing but the time; the on-policy reduction holds at the
step level; the proximal recompute equals the detached forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from trainer_helpers import random_batch, trajectory

from astraflow.consumers.trainer.batching import micro_batches, pack, prepare
from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.consumers.trainer.rl import rl_step
from astraflow.consumers.trainer.state import TrainState, forward
from astraflow.core.records import Batch, Group


def train_state(tiny_dir: Path, *, sgd: bool = False, **kw: object) -> TrainState:
    """A train state on the tiny model; ``sgd``: plain SGD at lr 1 without clipping, so that the
    parameter change *is* the gradient (Adam's first step, lr·g/|g|, would amplify rounding
    differences of near-zero gradient entries into full-size steps)."""
    e = build_train_state(TrainerConfig.model_validate({"device": "cpu", **kw}), tiny_dir)
    if sgd:
        e.optimizer = torch.optim.SGD(e.model.parameters(), lr=1.0)
        e.lr, e.grad_clip = 1.0, None
    return e


def params(e: TrainState) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in e.model.state_dict().items()}


def assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), k


def test_prepare_shifts_cuts_and_counts() -> None:
    t1 = trajectory([1, 5, 6, 7, 8, 9], 3, reward=1.0, logprobs=[-1.0, -2.0, -3.0])
    # loss tokens 2..3 only, then a tool span that is not trained on: cut after token 3
    t2 = trajectory([1, 5, 6, 7, 8, 9], 2, reward=0.0)
    t2.loss_mask = bytes([1, 0, 1, 1, 0, 0])  # a bit on token 0 has no prediction: ignored
    b = Batch(id="b", policy="default", seq=0, groups=[
        Group(group_id="g", task_id="t", trajectories=[t1, t2])])
    prep = prepare(b, std_norm=False)
    assert prep.n_tokens == 5 and prep.n_seqs == 2 and prep.max_completion == 3
    assert [s.length for s in prep.seqs] == [6, 4]
    assert [s.advantage for s in prep.seqs] == [0.5, -0.5]
    (mb,) = micro_batches(prep, token_budget=100, pad_id=0)
    assert mb.input_ids.tolist() == [[1, 5, 6, 7, 8, 9], [1, 5, 6, 7, 0, 0]]
    assert mb.targets.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]]
    assert mb.mask.tolist() == [[False, False, True, True, True],
                                [False, True, True, False, False]]
    assert mb.behav[0, 2:].tolist() == [-1.0, -2.0, -3.0]
    assert mb.weights.sum().item() == pytest.approx(1.0)


def test_pack_respects_budget_and_is_deterministic() -> None:
    lengths = [5, 9, 3, 9, 1, 4]
    groups = pack(lengths, 18)
    assert sorted(i for g in groups for i in g) == list(range(6))
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 18
    assert groups == pack(lengths, 18)
    assert pack([30], 10) == [[0]]  # too long: alone


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batching_is_exact(tiny_dir: Path, agg: str) -> None:
    batch = random_batch(0, groups=4, group_size=4)
    results = []
    for budget in (100_000, 12):
        e = train_state(tiny_dir, sgd=True, micro_batch_tokens=budget, loss={"aggregation": agg})
        m = rl_step(e, batch, 0)
        results.append((params(e), m))
    (p_whole, m_whole), (p_micro, m_micro) = results
    assert m_whole["micro_batches"] == 1 and m_micro["micro_batches"] > 4
    assert m_micro["loss"] == pytest.approx(m_whole["loss"], abs=1e-6)
    assert m_micro["grad_norm"] == pytest.approx(m_whole["grad_norm"], rel=1e-5)
    assert_close(p_whole, p_micro, atol=1e-6)


def test_skipping_zero_advantage_groups_changes_nothing_but_time(tiny_dir: Path) -> None:
    batch = random_batch(1, groups=6, group_size=4, zero_groups=3)
    results = []
    for skip in (False, True):
        e = train_state(tiny_dir, sgd=True, skip_zero_advantage_groups=skip)
        m = rl_step(e, batch, 0)
        m2 = rl_step(e, random_batch(2, groups=2, zero_groups=1), 1)
        results.append((params(e), m, m2))
    (p_all, m_all, _), (p_skip, m_skip, m2) = results
    assert m_all["groups_zero_adv"] == 3 and m_all["groups_skipped"] == 0
    assert m_skip["groups_skipped"] == 3 and m2["groups_skipped"] == 1
    assert m_skip["seqs_trained"] == 12 and m_all["seqs_trained"] == 24
    assert m_skip["loss"] == pytest.approx(m_all["loss"], abs=1e-6)
    assert_close(p_all, p_skip, atol=1e-6)


def test_all_groups_skipped_is_a_zero_gradient_step(tiny_dir: Path) -> None:
    batch = random_batch(3, groups=2, zero_groups=2)
    out = []
    for skip in (False, True):
        e = train_state(tiny_dir, skip_zero_advantage_groups=skip)
        before = params(e)
        m = rl_step(e, batch, 0)
        out.append(params(e))
        assert m["grad_norm"] == 0.0
    assert all(torch.equal(out[0][k], out[1][k]) for k in out[0])
    assert all(torch.equal(out[0][k], before[k]) for k in out[0])  # Adam: 0 / (0 + eps)


def on_policy_batch(e: TrainState, seq: int) -> Batch:
    """random_batch with behaviour logprobs recomputed by the state's current model."""
    batch = random_batch(seq, groups=3, group_size=4)
    prep = prepare(batch, skip_zero=False)
    (mb,) = micro_batches(prep, token_budget=10**6)
    with torch.no_grad():
        e.model.eval()
        logp, _ = forward(e, e.model, mb)
    rows = iter(range(len(prep.seqs)))
    order = np.argsort([-s.length for s in prep.seqs], kind="stable")
    by_seq = {int(i): r for r, i in enumerate(order)}
    for g in batch.groups:
        for t in g.trajectories:
            r = by_seq[next(rows)]
            n = len(t.token_ids) // 4
            lp = np.zeros(n, dtype="<f4")
            lp[1:] = logp[r, :n - 1].numpy()
            mask = np.frombuffer(t.loss_mask, dtype="u1")
            t.logprobs = np.where(mask > 0, lp, 0).astype("<f4").tobytes()
    return batch


def test_decoupled_step_equals_on_policy_grpo_step(tiny_dir: Path) -> None:
    results = []
    for decoupled in (True, False):
        e = train_state(tiny_dir, sgd=True, loss={"decoupled": decoupled})
        m = rl_step(e, on_policy_batch(e, 4), 0)
        assert m["behav_weight_max"] == pytest.approx(1.0, abs=1e-5)
        assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
        results.append(params(e))
    assert_close(results[0], results[1], atol=1e-6)


def test_proximal_recompute_equals_detached_forward(tiny_dir: Path) -> None:
    e = train_state(tiny_dir)
    prep = prepare(random_batch(5), skip_zero=False)
    (mb,) = micro_batches(prep, token_budget=10**6)
    e.model.eval()
    with_grad, _ = forward(e, e.model, mb)
    with torch.no_grad():
        recomputed, _ = forward(e, e.model, mb)
    assert torch.equal(with_grad.detach(), recomputed)
