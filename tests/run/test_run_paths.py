"""`astraflow run` asks the roles' configs where their files are: the final export reads the
trainer's configured ``trainer.checkpoint_dir``, the warm-up's comes from its own config."""

from __future__ import annotations

from pathlib import Path

from astraflow.config import ExperimentConfig
from astraflow.run.launch import warmup_config
from astraflow.run.orchestrate import export_final


def _step(root: Path, version: int, weights: bytes) -> None:
    step = root / f"step-{version:010d}"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(weights)


def test_the_final_export_reads_the_configured_checkpoint_dir(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"base")
    out = tmp_path / "run"
    cfg = ExperimentConfig.model_validate({
        "run": "x", "models": {"default": {"path": str(base), "build": "none"}},
        "trainer": {"checkpoint_dir": str(tmp_path / "elsewhere" / "{policy}")}})
    _step(tmp_path / "elsewhere" / "default", 3, b"trained")
    _step(out / "checkpoints" / "trainer-default", 9, b"decoy")  # the default place: ignored
    assert cfg.trainer.checkpoint_root(out, "default") == tmp_path / "elsewhere" / "default"
    assert export_final(cfg, out) == {"default": out / "final" / "default"}
    assert (out / "final" / "default" / "model.safetensors").read_bytes() == b"trained"
    assert (out / "final" / "default" / "config.json").exists()


def test_no_checkpoint_exports_nothing(tmp_path: Path) -> None:
    cfg = ExperimentConfig.model_validate({"run": "x"})
    assert export_final(cfg, tmp_path) == {}


def test_the_warmup_checkpoints_are_its_own(tmp_path: Path) -> None:
    cfg = ExperimentConfig.model_validate({"run": "x", "launch": {"warmup": {"steps": 5}}})
    warm = warmup_config(cfg)
    assert (warm.trainer.checkpoint_root(tmp_path, "p")
            == tmp_path.resolve() / "checkpoints" / "warmup-p")
    assert cfg.trainer.checkpoint_root(tmp_path, "p") != warm.trainer.checkpoint_root(tmp_path, "p")
