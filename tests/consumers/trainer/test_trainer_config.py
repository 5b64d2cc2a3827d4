"""The trainer section: defaults, and every problem reported with its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ExperimentConfig
from astraflow.consumers.trainer.build import build_train_state, loss_spec
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.core.config import validate
from astraflow.core.errors import ConfigError
from astraflow.run.roles import configured_trainer


def test_defaults_are_valid_and_map_to_a_loss_spec() -> None:
    tc = ExperimentConfig().trainer
    assert tc.mode == "rl" and tc.loss.aggregation == "token-mean"
    spec = loss_spec(tc)
    assert (spec.eps_low, spec.eps_high, spec.dual_clip, spec.kl) == (0.2, 0.2, None, "none")


def test_problems_are_reported_together_with_their_keys() -> None:
    with pytest.raises(ConfigError) as err:
        validate(ExperimentConfig, {"trainer": {
            "mode": "ppo", "loss": {"aggregation": "mean", "eps_low": 1.5, "dual_clip": 0.5,
                                    "klcoef": 1},
            "micro_batch_tokens": 0}})
    text = str(err.value)
    for key in ("trainer.mode", "trainer.loss.aggregation", "trainer.loss.eps_low",
                "trainer.loss.dual_clip", "trainer.loss.klcoef", "trainer.micro_batch_tokens"):
        assert key in text, key
    assert "seq-mean-token-sum-norm" in text  # valid options listed


@pytest.mark.parametrize("loss,needle", [
    ({"kl": "k3"}, "kl_coef > 0"),
    ({"kl_coef": 0.1}, "choose kl: k1 or k3"),
    ({"norm_length": 16}, "only applies to aggregation"),
])
def test_inconsistent_switches(loss: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        validate(ExperimentConfig, {"trainer": {"loss": loss}})


def test_cuda_without_a_device_is_a_clear_error(tiny_dir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ConfigError, match="no CUDA device"):
        build_train_state(TrainerConfig(device="cuda"), tiny_dir)


def test_unknown_policy(experiment: Any, tmp_path: Path) -> None:
    from astraflow.run.resources import open_bus

    cfg = experiment()
    with pytest.raises(ConfigError, match="unknown policy 'solver'; valid: default"):
        configured_trainer(cfg, "solver", tmp_path, bus=open_bus(cfg, tmp_path))


# per-policy trainer sections ------------------------------------------------------------------

TWO = {"policies": ["solver", "verifier"]}


def test_without_trainers_every_policy_trains_with_the_shared_section() -> None:
    cfg = validate(ExperimentConfig, {**TWO, "trainer": {"optimizer": {"lr": 1e-4}}})
    assert cfg.trainers == {}
    assert cfg.trainer_for("solver") is cfg.trainer and cfg.trainer_for("verifier") is cfg.trainer
    assert ExperimentConfig().trainer_for("default") == TrainerConfig()


def test_a_policys_overrides_are_deep_merged_over_the_shared_section() -> None:
    cfg = validate(ExperimentConfig, {**TWO, "trainer": {
        "optimizer": {"lr": 1e-4, "weight_decay": 0.1}, "loss": {"eps_high": 0.28},
        "max_steps": 50}, "trainers": {"verifier": {
            "optimizer": {"lr": 1e-5}, "loss": {"kl": "k3", "kl_coef": 0.01}}}})
    solver, verifier = cfg.trainer_for("solver"), cfg.trainer_for("verifier")
    assert solver is cfg.trainer
    assert verifier.optimizer.lr == 1e-5 and solver.optimizer.lr == 1e-4
    # siblings of an overridden key keep the shared values; untouched sections too
    assert verifier.optimizer.weight_decay == 0.1 and verifier.loss.eps_high == 0.28
    assert verifier.max_steps == 50 and (verifier.loss.kl, verifier.loss.kl_coef) == ("k3", 0.01)
    assert (solver.loss.kl, cfg.trainer.optimizer.lr) == ("none", 1e-4)  # the base untouched
    # the merge follows later changes of the shared section (tests and tools set it in code)
    cfg.trainer.max_steps = 7
    assert cfg.trainer_for("verifier").max_steps == 7


def test_trainers_overrides_come_through_set() -> None:
    from astraflow.config import load_experiment

    cfg = load_experiment(None, ["policies=[solver, verifier]",
                                 "trainers.verifier.optimizer.lr=2e-5"])
    assert cfg.trainer_for("verifier").optimizer.lr == 2e-5
    assert cfg.trainer_for("solver").optimizer.lr == TrainerConfig().optimizer.lr


def test_bad_per_policy_sections_are_reported_together_with_their_paths() -> None:
    with pytest.raises(ConfigError) as err:
        validate(ExperimentConfig, {**TWO, "seed": "x", "trainers": {
            "verifier": {"mode": "ppo", "optimizer": {"lr": -1, "lrr": 1}},
            "solvr": {"optimizer": {"lr": 1e-5}}}})
    text = str(err.value)
    lines = text.splitlines()
    for key in ("config: seed:", "config: trainers.verifier.mode:",
                "config: trainers.verifier.optimizer.lr:",
                "config: trainers.verifier.optimizer.lrr: unknown key",
                "config: trainers.solvr: unknown policy 'solvr'"):
        assert any(line.strip().startswith(f"- {key}") for line in lines), (key, text)
    assert "valid keys here: betas, eps, lr" in text  # the unknown key's valid siblings
    assert "valid (policies): solver, verifier" in text


def test_a_merge_that_breaks_a_cross_field_rule_is_refused_at_its_policy() -> None:
    # valid alone, invalid once merged: the shared kl_coef meets the policy's kl: none
    with pytest.raises(ConfigError, match=r"trainers\.verifier: .*kl_coef=0\.1 with "
                                          r"loss\.kl=none"):
        validate(ExperimentConfig, {**TWO, "trainer": {"loss": {"kl": "k3", "kl_coef": 0.1}},
                                    "trainers": {"verifier": {"loss": {"kl": "none"}}}})


def test_models_naming_no_policy_are_refused_with_the_key() -> None:
    with pytest.raises(ConfigError, match=r"models\.verifer: unknown policy 'verifer'"):
        validate(ExperimentConfig, {**TWO, "models": {"verifer": {}}})


def test_build_trainer_gets_its_policys_section(experiment: Any, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import astraflow.consumers.trainer.build as trainer_build

    seen: dict[str, TrainerConfig] = {}

    def fake_build(section: TrainerConfig, model: Any, *, policy: str, **kw: Any) -> str:
        seen[policy] = section
        return policy

    monkeypatch.setattr(trainer_build, "build_trainer", fake_build)
    cfg = experiment(policies=["default", "verifier"],
                     trainers={"verifier": {"optimizer": {"lr": 1e-6}}})
    for policy in cfg.policies:
        assert configured_trainer(cfg, policy, tmp_path, bus=None) == policy  # type: ignore[arg-type]
    assert seen["default"] is cfg.trainer
    assert seen["verifier"].optimizer.lr == 1e-6
    assert seen["verifier"].session_timeout_s == cfg.trainer.session_timeout_s == 1.0
