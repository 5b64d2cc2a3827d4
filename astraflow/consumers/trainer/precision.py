"""``trainer.mixed_precision: auto``: bf16 autocast where the hardware computes bf16 natively,
fp32 elsewhere.

A CPU without bf16 instructions (no ``avx512_bf16`` or ``amx_bf16``, e.g. an AVX2-only one)
emulates bf16 autocast many times slower than fp32; :func:`resolve` picks ``no`` there, and
:func:`slow_bf16` says when an explicit ``bf16`` will be slow.
"""

from __future__ import annotations

import functools
from pathlib import Path

#: the CPU flags (Linux /proc/cpuinfo) of native bf16 arithmetic
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
CPUINFO = Path("/proc/cpuinfo")


@functools.cache
def cpu_native_bf16() -> bool:
    """Whether this CPU has bf16 instructions; False where it cannot be told (no
    /proc/cpuinfo)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(BF16_FLAGS & set(line.partition(":")[2].split()))
    return False


#: what a host with a GPU torch could use has (NVIDIA's driver; ROCm's kernel driver)
GPU_DRIVER_PATHS = (Path("/proc/driver/nvidia"), Path("/dev/nvidiactl"), Path("/dev/kfd"))


def on_cpu(device: str) -> bool:
    """Whether a trainer with ``trainer.device`` ``device`` computes on the CPU (``auto``
    without a CUDA device included). Without a GPU driver on the host that is known without
    importing torch (~3 CPU-s, which `astraflow run`'s own process need not pay)."""
    if device != "auto":
        return device == "cpu"
    if not any(p.exists() for p in GPU_DRIVER_PATHS):
        return True
    import torch

    return not torch.cuda.is_available()


def resolve(setting: str, *, cpu: bool) -> str:
    """The autocast precision of ``setting`` (``no``, ``bf16``, ``fp16`` or ``auto``) on the
    trainer's device (``cpu``: a CPU, else CUDA)."""
    if setting != "auto":
        return setting
    if cpu:
        return "bf16" if cpu_native_bf16() else "no"
    import torch

    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def slow_bf16(setting: str, *, cpu: bool) -> str | None:
    """Why ``setting`` will be slow on this device, or None."""
    if setting == "bf16" and cpu and not cpu_native_bf16():
        return ("trainer.mixed_precision bf16 on a CPU without bf16 instructions (no "
                "avx512_bf16 or amx_bf16 in /proc/cpuinfo): autocast emulates it, many times "
                "slower than fp32 (docs/trainer.md, \"Devices and data parallelism\"); use "
                "mixed_precision: auto (bf16 where native, else fp32) or no")
    return None
