"""``launch.trainer_ranks``: `astraflow run` starts each policy's trainer as a gang of ranks
(astraflow.core.gang); the SFT warm-up trains in one process with single-file checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import load_experiment
from astraflow.run.launch import rl_roles, warmup_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ranks", [1, 2])
def test_trainer_role_is_a_gang_of_ranks(tmp_path: Path, ranks: int) -> None:
    cfg = load_experiment(ROOT / "examples" / "quickstart.yaml")
    cfg = cfg.model_copy(update={"launch": cfg.launch.model_copy(
        update={"trainer_ranks": ranks})})
    argv = {r.name: r.argv for r in rl_roles(cfg, tmp_path / "c.yaml", tmp_path)}[
        "trainer-default"]
    train = argv[argv.index("train"):]
    assert train[:2] == ["train", str(tmp_path / "c.yaml")]
    if ranks == 1:
        assert "astraflow.core.gang" not in argv
    else:
        assert argv[1:5] == ["-m", "astraflow.core.gang", "2", "--"]


def test_warm_up_trains_in_one_process(tmp_path: Path) -> None:
    cfg = load_experiment(ROOT / "examples" / "quickstart.yaml")
    data = cfg.model_dump()
    data["trainer"]["parallel"] = "fsdp"
    data["launch"]["trainer_ranks"] = 2
    warm = warmup_config(type(cfg).model_validate(data))
    assert warm.trainer.parallel == "ddp"
