"""What a stage trusts: a trajectory's values are checked against the run's facts at the
post-rollout stage's door, and a weight manifest moves a stage's version only when a trainer
can have made it. Each refused record is dead-lettered with its reason and the stage goes on.
On the embedded bus, with a tiny model built for its vocabulary."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import msgspec
from policy_helpers import group_trajs, manifest, produce, read_all, trained_to, traj

from astraflow.config import ExperimentConfig
from astraflow.core.records import DeadLetter, TensorEntry, pack_i32
from astraflow.core.topics import topic_name
from astraflow.policies.runner import StageRunner
from astraflow.run.resources import open_bus
from astraflow.run.roles import configured_runner, run_configured_stage, vocab_sizes

POST = {"post_rollout": ["assembler"], "assembler": {"group_size": 2},
        "commit_interval_s": 0.001}


def letters(bus: object, run: str) -> list[DeadLetter]:
    return read_all(bus, topic_name(run, "dlq"))  # type: ignore[arg-type]


def test_untrustworthy_trajectories_are_dead_lettered_with_their_reason(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    cfg = make_config(POST, models={"default": {"path": str(tmp_path / "m"),
                                                "build": "tiny-arith"}})
    vocab = vocab_sizes(cfg, tmp_path)["default"]
    assert 10 < vocab < 1000
    bus = open_bus(cfg, tmp_path)
    bad = [
        msgspec.structs.replace(traj("oov#0", 0, 1.0), token_ids=pack_i32([999999] * 12)),
        msgspec.structs.replace(traj("edge#0", 0, 1.0), token_ids=pack_i32([vocab] * 12)),
        msgspec.structs.replace(traj("neg#0", 0, 1.0), token_ids=pack_i32([-5] * 12)),
        traj("nan#0", 0, math.nan),
        traj("big#0", 0, 1e308),
        traj("future#0", 0, 1.0, version=1_000_000),
    ]
    honest = group_trajs("ok#0", [1.0, 0.0])
    produce(bus, cfg.run, "trajectories", bad + honest)
    counters = run_configured_stage(cfg, "post_rollout", bus=bus, out=tmp_path,
                         max_records=len(bad) + len(honest), timeout=30)
    assert counters["runner.dead_lettered"] == len(bad)
    reasons = {d.key: d.error for d in letters(bus, cfg.run)}
    assert "token id 999999 is outside the vocabulary of policy 'default'" in reasons[b"oov#0"]
    assert f"token id {vocab} is outside" in reasons[b"edge#0"]
    assert "token id -5 is negative" in reasons[b"neg#0"]
    assert "must be finite" in reasons[b"nan#0"]
    assert "beyond the reward bound 1e+06" in reasons[b"big#0"]
    assert "a token of version 1000000, but only 0 batch records" in reasons[b"future#0"]
    groups = read_all(bus, topic_name(cfg.run, "groups", "default"))
    assert [g.group_id for g in groups] == ["ok#0"]  # the honest group went on
    bus.close()


def test_clip_lets_an_extreme_reward_through_clipped(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    cfg = make_config({**POST, "records": {"reward_bound": 5.0, "beyond_bound": "clip"}})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, "trajectories", group_trajs("x#0", [1e308, -7.0]))
    counters = run_configured_stage(cfg, "post_rollout", bus=bus, out=tmp_path, max_records=2, timeout=30)
    assert "runner.dead_lettered" not in counters or counters["runner.dead_lettered"] == 0
    (group,) = read_all(bus, topic_name(cfg.run, "groups", "default"))
    assert sorted(r.reward for r in group.refs) == [-5.0, 5.0]
    bus.close()


def _gate(cfg: ExperimentConfig, tmp_path: Path, bus: object, **kw: object) -> StageRunner:
    return configured_runner(cfg, "pre_rollout", out=tmp_path, bus=bus, **kw)  # type: ignore[arg-type]


def test_a_stage_believes_only_the_versions_a_trainer_can_have_made(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    """The forged manifests of the attack (version 1,000,000,000 with a blob path out of the
    store; a well-formed one far ahead of the batches) are dead-lettered; the trainer's real
    versions still move the gate."""
    cfg = make_config()
    bus = open_bus(cfg, tmp_path)
    escape = manifest(1_000_000_000)
    escape.tensors = [TensorEntry(name="w", shape=[2], dtype="float32", offset=0, length=8,
                                  uri="../../../etc/passwd")]
    trained_to(bus, cfg.run, 2)
    produce(bus, cfg.run, "weights", [manifest(1), escape, manifest(1_000_000_000),
                                      manifest(2), manifest(3)], policy="default")
    runner = _gate(cfg, tmp_path, bus)
    runner.run(timeout=4.0)
    assert runner.chain.ctx.versions == {"default": 2}
    errors = [d.error for d in letters(bus, cfg.run)]
    assert len(errors) == 3, errors
    assert "refused blob path '../../../etc/passwd'" in errors[0]
    assert "claims version 1000000000, but only 2 batch records" in errors[1]
    assert "claims version 3" in errors[2]
    bus.close()


def test_a_forged_version_in_a_checkpoint_is_cut_back_on_restore(
        make_config: Callable[..., ExperimentConfig], tmp_path: Path) -> None:
    """A stage that believed a forged manifest before the check checkpointed its version: the
    restart cuts it back to what the trainer can have made, so the stall does not survive."""
    cfg = make_config()
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, "weights", [manifest(1_000_000_000)], policy="default")
    believer = _gate(cfg, tmp_path, bus)
    believer.versions = None  # as a stage built before the check
    believer.run(timeout=3.0)
    assert believer.chain.ctx.versions == {"default": 1_000_000_000}
    trained_to(bus, cfg.run, 4)
    restarted = _gate(cfg, tmp_path, bus)
    restarted.run(timeout=2.0)
    assert restarted.chain.ctx.versions == {"default": 4}
    bus.close()
