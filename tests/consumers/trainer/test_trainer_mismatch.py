"""Train–inference mismatch (astraflow.consumers.trainer.mismatch): an RL step reports how far
the engine's logprobs of the trained tokens are from the trainer's, fresh and stale tokens
apart, and the alarm reads it: none for logprobs the trainer itself computed, a breach for
perturbed ones."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from trainer_helpers import on_policy, random_batch

from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.config import MismatchConfig, TrainerConfig
from astraflow.consumers.trainer.mismatch import (
    Alarm,
    Tally,
    describe,
    fresh_tokens,
    step_metrics,
)
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.records import Batch, pack_f32, unpack


def perturbed(batch: Batch, noise: float, seed: int = 0) -> Batch:
    """``batch`` with Gaussian noise of std ``noise`` added to every sampled-token logprob
    (an engine that disagrees with the trainer)."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in batch.groups:
        trajs = []
        for t in g.trajectories:
            lp = unpack(t.logprobs, "<f4").astype(np.float64)
            lp[t.prompt_len:] += rng.normal(0.0, noise, size=len(lp) - t.prompt_len)
            trajs.append(msgspec.structs.replace(t, logprobs=pack_f32(lp.tolist())))
        groups.append(msgspec.structs.replace(g, trajectories=trajs))
    return msgspec.structs.replace(batch, groups=groups)


def with_versions(batch: Batch, version: int) -> Batch:
    """Every trajectory of ``batch`` sampled at weights ``version``."""
    from astraflow.core.records import pack_i32

    groups = []
    for g in batch.groups:
        trajs = [msgspec.structs.replace(t, versions=pack_i32(
            [-1] * t.prompt_len + [version] * (len(unpack(t.token_ids, "<i4")) - t.prompt_len)))
            for t in g.trajectories]
        groups.append(msgspec.structs.replace(g, trajectories=trajs))
    return msgspec.structs.replace(batch, groups=groups)


@pytest.fixture
def state(tiny_dir: Path):  # noqa: ANN201
    return build_train_state(TrainerConfig.model_validate({"device": "cpu"}), tiny_dir)


def test_the_trainers_own_logprobs_show_no_mismatch(state) -> None:  # noqa: ANN001
    batch = with_versions(on_policy(random_batch(0, groups=4, group_size=4), state.model), 0)
    m = rl_step(state, batch, 0)
    assert m["mismatch_tokens_fresh"] > 0 and m["mismatch_tokens_stale"] == 0, m
    # the same weights, the same fp32 maths in another batch layout: rounding only
    assert 0.0 <= m["mismatch_k3_fresh"] < 1e-10 and m["mismatch_abs_max_fresh"] < 1e-4, m
    assert m["mismatch_beyond_fresh"] == 0.0 and "mismatch_k3_stale" not in m
    assert Alarm.from_config(MismatchConfig(max_k3=1e-6, max_beyond=0.01)).breaches(m) == []


def test_a_disagreeing_engine_breaches_and_stale_tokens_are_apart(state) -> None:  # noqa: ANN001
    clean = on_policy(random_batch(0, groups=4, group_size=4), state.model)
    # fresh tokens whose engine logprobs are off by ~0.3 nats: k3 ≈ E[d²/2] ≈ 0.045
    m = rl_step(state, with_versions(perturbed(clean, 0.3), 0), 0)
    assert 0.02 < m["mismatch_k3_fresh"] < 0.1, m
    assert m["mismatch_abs_max_fresh"] >= m["mismatch_abs_p99_fresh"] > 0.3, m
    alarm = Alarm.from_config(MismatchConfig())  # the default: k3 above 0.01
    (why,) = alarm.breaches(m)
    assert why.startswith("k3 0.0") and "trainer.mismatch.max_k3 0.01" in why
    line = describe(1, "default", [why], m)
    assert "train-inference mismatch at step 1 (default)" in line and "tokens sampled" in line
    # the same perturbation on tokens sampled at an older version: counted as stale, and
    # stale tokens never raise the alarm (the policy moved since: that is not a mismatch)
    m = rl_step(state, with_versions(perturbed(clean, 0.3), 0), 1)
    assert m["mismatch_tokens_fresh"] == 0 and m["mismatch_k3_stale"] > 0.02, m
    assert alarm.breaches(m) == []
    # a share of tokens beyond the threshold
    beyond = Alarm.from_config(MismatchConfig(max_k3=None, max_beyond=0.1, token_threshold=0.2))
    m = rl_step(state, with_versions(perturbed(clean, 0.3), 2), 2)
    assert m["mismatch_beyond_fresh"] > 0.3, m
    (why,) = beyond.breaches(m)
    assert "|log ratio| > 0.2" in why and "max_beyond 0.1" in why


def test_the_tally_splits_by_version_and_reduces_to_means() -> None:
    t = Tally(threshold=0.5)
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    behav = torch.tensor([[-1.0, -1.0, -0.5, -2.0]])
    mask = torch.tensor([[True, True, False, True]])
    t.add(logp, behav, mask, torch.tensor([[5, 5, -1, 3]]), 5)
    m = step_metrics(t.totals())
    assert m["mismatch_tokens_fresh"] == 2 and m["mismatch_tokens_stale"] == 1
    k3 = float(np.expm1(-1.0) + 1.0)  # d = -1: (e^-1 - 1) + 1
    assert m["mismatch_k3_fresh"] == pytest.approx(k3 / 2)
    assert m["mismatch_k3_stale"] == pytest.approx(k3)
    assert m["mismatch_abs_max_fresh"] == 1.0 and m["mismatch_beyond_fresh"] == 0.5
    assert step_metrics(Tally(threshold=0.5).totals()) == {"mismatch_tokens_fresh": 0.0,
                                                           "mismatch_tokens_stale": 0.0}


def test_a_token_after_an_update_mid_reply_is_not_fresh() -> None:
    """Sampled at the trainer's version, but over a prefix (KV cache) of the version before:
    stale. Untrained positions between (a prompt, a tool's output: version -1) break
    nothing."""
    mask = torch.tensor([[False, True, True, False, True],
                         [False, True, True, False, True],
                         [False, False, True, True, True]])
    versions = torch.tensor([[-1, 7, 7, -1, 7],  # the whole reply at 7: fresh
                             [-1, 6, 7, -1, 7],  # the update landed after the first token
                             [-1, -1, 6, 6, 6]])  # all older: stale
    got = fresh_tokens(mask, versions, 7)
    assert got.tolist() == [[False, True, True, False, True],
                            [False, False, False, False, False],
                            [False, False, False, False, False]]


def test_no_bound_means_no_alarm() -> None:
    assert Alarm.from_config(MismatchConfig(max_k3=None)) is None
    with pytest.raises(ValueError, match="on_breach"):
        MismatchConfig.model_validate({"on_breach": "panic"})
