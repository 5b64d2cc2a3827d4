"""``trainer.mixed_precision: auto`` picks bf16 only where the hardware computes it natively;
an explicit bf16 on a CPU without bf16 instructions is warned about."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.consumers.trainer import precision

AVX2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"


@pytest.fixture
def cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Point the bf16 probe at a written /proc/cpuinfo."""
    def use(text: str | None) -> None:
        f = tmp_path / "cpuinfo"
        if text is None:
            f.unlink(missing_ok=True)
        else:
            f.write_text(text)
        monkeypatch.setattr(precision, "CPUINFO", f)
        precision.cpu_native_bf16.cache_clear()
    yield use
    precision.cpu_native_bf16.cache_clear()


def test_auto_is_bf16_only_on_a_cpu_with_bf16_instructions(cpuinfo) -> None:
    cpuinfo(AVX2)
    assert precision.resolve("auto", cpu=True) == "no"
    assert "many times slower than fp32" in precision.slow_bf16("bf16", cpu=True)
    cpuinfo(SAPPHIRE)
    assert precision.resolve("auto", cpu=True) == "bf16"
    assert precision.slow_bf16("bf16", cpu=True) is None
    cpuinfo(None)  # no /proc/cpuinfo: not known to be native
    assert precision.resolve("auto", cpu=True) == "no"


def test_explicit_settings_pass_through(cpuinfo) -> None:
    cpuinfo(AVX2)
    for setting in ("no", "bf16", "fp16"):
        assert precision.resolve(setting, cpu=True) == setting
    assert precision.slow_bf16("no", cpu=True) is None
    assert precision.slow_bf16("bf16", cpu=False) is None  # a GPU is not judged by the CPU


def test_device_auto_is_the_cpu_without_a_gpu_driver_else_what_torch_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert precision.on_cpu("cpu") and not precision.on_cpu("cuda")
    asked: list[bool] = []

    def cuda_available() -> bool:
        asked.append(True)
        return True

    monkeypatch.setattr(torch.cuda, "is_available", cuda_available)
    monkeypatch.setattr(precision, "GPU_DRIVER_PATHS", (tmp_path / "nvidia",))
    assert precision.on_cpu("auto") and not asked  # no driver: the CPU, torch not asked
    (tmp_path / "nvidia").mkdir()
    assert not precision.on_cpu("auto") and asked  # a driver: torch says whether CUDA works


def test_the_trainer_built_with_auto_computes_as_resolved(cpuinfo, caplog) -> None:
    from astraflow.consumers.trainer.build import _device_settings
    from astraflow.consumers.trainer.config import TrainerConfig

    cpuinfo(AVX2)
    acc = _device_settings(TrainerConfig(device="cpu", mixed_precision="auto"))
    assert acc.mixed_precision == "no"
    with caplog.at_level("WARNING", logger="astraflow.trainer"):
        acc = _device_settings(TrainerConfig(device="cpu", mixed_precision="bf16"))
    assert acc.mixed_precision == "bf16"  # what was asked, with the warning
    assert "without bf16 instructions" in caplog.text
    cpuinfo(SAPPHIRE)
    assert _device_settings(TrainerConfig(device="cpu", mixed_precision="auto")) \
        .mixed_precision == "bf16"


def test_check_says_what_auto_picks(cpuinfo) -> None:
    from astraflow.config import load_experiment
    from astraflow.run.check import CheckReport, _check_precision

    root = Path(__file__).resolve().parents[3]
    config = load_experiment(root / "examples" / "smollm2_team.yaml",
                             ["trainer.device=cpu"])
    cpuinfo(AVX2)
    report = CheckReport()
    _check_precision(config, "solver", report)
    assert [f.message for f in report.findings] == ["auto: fp32 on this CPU (no bf16 instructions)"]
    report = CheckReport()
    _check_precision(load_experiment(root / "examples" / "smollm2_team.yaml",
                                     ["trainer.device=cpu", "trainer.mixed_precision=bf16"]),
                     "solver", report)
    assert report.ok and report.findings[0].message.startswith("warning: trainer.mixed_precision")
