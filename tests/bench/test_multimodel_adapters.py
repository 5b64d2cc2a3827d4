"""bench/multimodel.py's lockstep baseline on policies that are LoRA adapters of one base
(trainer.lora, rollout.engine.adapters, as examples/smollm2_team.yaml): one engine of the base
with a view per policy, a sync puts the trainer's adapter (in the serving dtype) into its own
policy's slot only and moves that policy's version only, each policy is measured with its own
adapter, and a step runs. A tiny model built here; not timings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ExperimentConfig
from astraflow.run.resources import model_dir
from bench.lib.arms import arm_config
from bench.multimodel import (
    Lockstep,
    check_adapter_applied,
    check_shared_base,
    served,
    tail_latency,
    versions_line,
)

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("peft")

EXAMPLE = ROOT / "examples" / "solver_verifier.yaml"
ADAPTERS = ["data.batch_size=2", "producer.n_samples=2", "launch.eval_problems=6",
            "rollout.max_concurrent_episodes=8", "trainer.optimizer.warmup_steps=0",
            "trainer.optimizer.lr=0.05", "trainers.verifier.optimizer.lr=0.05",
            "trainer.loss.entropy_coef=0.05", "trainer.skip_zero_advantage_groups=false",
            "trainer.lora.r=4", "trainer.lora.alpha=8",
            "trainer.lora.target_modules=[q_proj,v_proj]",
            "rollout.engine.adapters=[solver,verifier]"]


@pytest.fixture(scope="module")
def adapter_loop(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A lockstep loop over one tiny base shared by both policies' adapters."""
    tmp = tmp_path_factory.mktemp("adapters")
    built = ExperimentConfig.model_validate(arm_config(
        EXAMPLE, ADAPTERS, {}, seconds=1.0, latency=None) | {
        "models": {p: {"path": str(tmp / "base"), "build": "tiny-team", "seed": 0}
                   for p in ("solver", "verifier")}})
    base = model_dir(built, "solver", tmp)
    models = {p: base for p in built.policies}
    cfg = ExperimentConfig.model_validate(arm_config(EXAMPLE, ADAPTERS, models, seconds=1.0,
                                                     latency=None))
    loop = Lockstep(cfg, models, threads=1)
    yield loop
    loop.close()


def slot(loop: Lockstep, policy: str) -> dict[str, tuple[Any, Any]]:
    """The matrices in ``policy``'s slot of the shared engine, copied."""
    mats = loop.engines[policy].shared.adapters.slot(policy).mats
    return {m: (a.clone(), b.clone()) for m, (a, b) in mats.items()}


def test_one_base_engine_with_a_view_per_policy(adapter_loop: Lockstep) -> None:
    loop = adapter_loop
    views = loop.engines
    assert set(views) == {"solver", "verifier"}
    assert views["solver"].shared is views["verifier"].shared  # the worker's layout
    assert all(t.adapter is not None for t in loop.trainers.values())


def nudge_and_sync(loop: Lockstep, policy: str) -> None:
    """Move ``policy``'s trainer adapter (B away from zero, as training would) and sync it as
    its next version."""
    import torch

    with torch.no_grad():
        for n, p in loop.trainers[policy].model.named_parameters():
            if ".lora_B." in n:
                p.add_(0.1 * torch.randn_like(p))
    loop.versions[policy] += 1
    loop.sync(policy)


def test_sync_puts_the_trainers_adapter_into_its_own_slot_only(adapter_loop: Lockstep) -> None:
    import torch

    from astraflow.weights.adapter import PREFIX

    loop = adapter_loop
    nudge_and_sync(loop, "verifier")
    verifier = slot(loop, "verifier")
    assert verifier
    for n, p in loop.trainers["solver"].model.named_parameters():
        if ".lora_B." in n:
            with torch.no_grad():
                p.add_(0.1 * torch.randn_like(p))
    before = (loop.engines["solver"].version, loop.engines["verifier"].version)
    loop.versions["solver"] += 1
    loop.sync("solver")
    assert loop.engines["solver"].version == before[0] + 1
    assert loop.engines["verifier"].version == before[1]
    after = slot(loop, "verifier")
    assert after.keys() == verifier.keys() and all(
        torch.equal(after[m][i], verifier[m][i]) for m in after for i in (0, 1))
    # every adapter tensor of the trainer, rounded to weights.dtype, is in the solver's slot
    published = loop.trainers["solver"].state_tensors()
    mats = slot(loop, "solver")
    assert len(mats) * 2 == len(published) > 0
    for name, t in published.items():
        module, _, which = name.removeprefix(PREFIX).rpartition(".lora_")
        held = mats[module][0 if which == "A.weight" else 1]
        assert torch.equal(held, t.detach().to(torch.bfloat16).to(held.dtype)), name
    assert any(b.abs().sum() > 0 for _, b in mats.values())
    # a tensor the engine did not take, or a version it does not serve, is refused
    view = loop.engines["solver"]
    extra = {*published, "base_model.model.lm_head.lora_A.weight"}
    with pytest.raises(RuntimeError, match="missing"):
        check_adapter_applied(view, "solver", extra, loop.versions["solver"])
    with pytest.raises(RuntimeError, match="not applied"):
        check_adapter_applied(view, "solver", set(published), loop.versions["solver"] + 1)


def test_each_policy_is_measured_with_its_own_adapter(adapter_loop: Lockstep) -> None:
    import torch

    loop = adapter_loop
    nudge_and_sync(loop, "solver")
    nudge_and_sync(loop, "verifier")
    ids = torch.tensor([[3, 4, 5, 6]])
    logits = {}
    for p, view in loop.engines.items():
        with served(view) as (model, _), torch.no_grad():
            logits[p] = model(input_ids=ids).logits
    with torch.no_grad():  # no routing outside the block: the base alone
        base = loop.engines["solver"].shared.model(input_ids=ids).logits
    assert not torch.allclose(logits["solver"], base)
    assert not torch.allclose(logits["solver"], logits["verifier"])
    assert loop.engines["verifier"].shared.adapters.groups == []


def test_a_step_trains_both_adapters_and_versions_advance(adapter_loop: Lockstep) -> None:
    loop = adapter_loop
    start = dict(loop.versions)
    row = loop.step()
    assert loop.versions == {p: v + 1 for p, v in start.items()}
    assert {p: e.version for p, e in loop.engines.items()} == loop.versions
    assert row["failed"] == 0 and row["step_s"] > 0
    assert {t.policy for t in loop.trained["verifier"]} == {"verifier"}
    acc = loop.accuracy()
    assert 0.0 <= acc["accuracy"] <= 1.0 and 0.0 <= acc["system_accuracy"] <= 1.0


def test_adapters_need_one_base_and_the_tail_flags(tmp_path: Path) -> None:
    config = {"rollout": {"engine": {"adapters": ["solver", "verifier"]}}}
    check_shared_base(config, [], {"solver": tmp_path, "verifier": tmp_path})
    with pytest.raises(SystemExit, match="different models"):
        check_shared_base(config, [], {"solver": tmp_path / "a", "verifier": tmp_path / "b"})
    assert tail_latency(None, 0.5, 10.0) == {"type": "lognormal", "p50": 0.5, "p99": 10.0}
    assert tail_latency(None, None, None)["p99"] == 2.0
    with pytest.raises(ValueError, match="not both"):
        tail_latency({"type": "fixed", "seconds": 1.0}, 0.5, None)
    line = versions_line("pipeline", {
        "solver": [{"time": 0.0, "version": 0}, {"time": 5.0, "version": 3},
                   {"time": 10.0, "version": 6}],
        "verifier": [{"time": 0.0, "version": 0}, {"time": 9.0, "version": 1}]})
    assert line.endswith("solver 0 / 3 / 3 / 6; verifier 0 / 0 / 0 / 1")
