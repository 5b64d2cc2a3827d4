"""The trainer section: defaults, and every problem reported with its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from astraflow.config import ExperimentConfig
from astraflow.consumers.trainer.build import build_engine, loss_spec
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.core.config import validate
from astraflow.core.errors import ConfigError
from astraflow.run.roles import build_trainer


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
        build_engine(TrainerConfig(device="cuda"), tiny_dir)


def test_unknown_policy(experiment: Any, tmp_path: Path) -> None:
    from astraflow.config import open_bus

    cfg = experiment()
    with pytest.raises(ConfigError, match="unknown policy 'solver'; valid: default"):
        build_trainer(cfg, "solver", tmp_path, bus=open_bus(cfg, tmp_path))
