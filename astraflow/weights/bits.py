"""Tensors as raw bits: the dtype table, digests, and conversion from torch / numpy.

The codec never looks at floating-point values. A bf16 or fp16 tensor is handled as ``uint16``
words and an fp32 tensor as ``uint32`` words, so every bit pattern (NaN payloads, ±0,
subnormals, ±inf) round-trips exactly by construction.

numpy has no bfloat16: a numpy ``uint16`` array stands for bf16 bits (an ``ml_dtypes``
bfloat16 array is accepted too). torch is imported only when a torch tensor is passed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from astraflow.core.errors import WeightIntegrityError


@dataclass(frozen=True)
class DType:
    name: str  # the name in manifests and blobs
    bits: np.dtype[Any]  # the unsigned word the codec works on
    safetensors: str  # the dtype name in a .safetensors header
    torch: str  # the torch dtype attribute


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("bfloat16", np.dtype("<u2"), "BF16", "bfloat16"),
        DType("float16", np.dtype("<u2"), "F16", "float16"),
        DType("float32", np.dtype("<u4"), "F32", "float32"),
    )
}
BY_SAFETENSORS = {d.safetensors: d for d in DTYPES.values()}


def dtype_info(name: str, *, tensor: str = "") -> DType:
    """The :class:`DType` of ``name``; a clear error for anything else."""
    try:
        return DTYPES[name]
    except KeyError:
        where = f" (tensor {tensor!r})" if tensor else ""
        raise WeightIntegrityError(
            f"unsupported dtype {name!r}{where}; valid: {', '.join(DTYPES)}") from None


# ---------------------------------------------------------------------------------------------
# digests
# ---------------------------------------------------------------------------------------------

#: The digest written by this build. blake3 is cryptographic (a mirror cannot forge a blob that
#: matches the digest in a manifest read from the bus) and fast (docs/weights.md#the-codec).
DIGEST_ALGO = "blake3"
_DIGEST_BYTES = 16
_CHUNK = 1 << 22


def _blake3() -> Any:
    try:
        import blake3
    except ImportError:  # pragma: no cover - a declared dependency
        raise ImportError("the weights codec needs blake3: pip install 'blake3>=1,<2'") from None
    return blake3.blake3(max_threads=1)


class Hasher:
    """Incremental digest of a tensor's bytes (fed chunk by chunk while they are in cache)."""

    def __init__(self) -> None:
        self._h = _blake3()

    def update(self, words: np.ndarray) -> None:
        self._h.update(words.view(np.uint8))

    def hexdigest(self) -> str:
        return f"{DIGEST_ALGO}:{self._h.hexdigest(length=_DIGEST_BYTES)}"


def digest(words: np.ndarray) -> str:
    """``"blake3:<hex>"`` of the little-endian bytes of ``words`` (a contiguous array)."""
    h = Hasher()
    flat = words.reshape(-1)
    step = _CHUNK // max(1, flat.itemsize)
    for s in range(0, max(len(flat), 1), step):
        h.update(flat[s:s + step])
    return h.hexdigest()


def blob_digest(blob: bytes | memoryview) -> str:
    """The digest of a whole blob, as manifests carry it (``blake3:<hex>``)."""
    return digest(np.frombuffer(blob, dtype=np.uint8))


def check_digest_format(value: str, *, tensor: str) -> None:
    algo, _, hexpart = value.partition(":")
    if algo != DIGEST_ALGO or len(hexpart) != 2 * _DIGEST_BYTES:
        raise WeightIntegrityError(
            f"tensor {tensor!r}: unsupported digest {value!r}; this build reads "
            f"{DIGEST_ALGO}:<{2 * _DIGEST_BYTES} hex digits>")


# ---------------------------------------------------------------------------------------------
# conversion
# ---------------------------------------------------------------------------------------------

def numpy_bits(array: np.ndarray, *, name: str = "") -> tuple[str, np.ndarray]:
    """(dtype name, raw-bit view) of a numpy array: float16/float32 arrays, ml_dtypes bfloat16,
    or uint16 arrays standing for bf16 bits. The view shares memory with ``array``."""
    kind = array.dtype
    if kind == np.float16:
        return "float16", array.view("<u2")
    if kind == np.float32:
        return "float32", array.view("<u4")
    if kind.name == "bfloat16" or kind == np.uint16:
        return "bfloat16", array.view("<u2")
    if kind == np.uint32:
        return "float32", array
    raise WeightIntegrityError(
        f"tensor {name!r}: numpy dtype {kind} is not a weight dtype; valid: float16, float32, "
        "uint16 (bf16 bits), ml_dtypes.bfloat16")


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def torch_bits(t: Any, *, name: str = "", copy: bool, dtype: str | None = None
               ) -> tuple[str, np.ndarray]:
    """(dtype name, raw bits on the host) of a torch tensor, cast to ``dtype`` first when given.
    With ``copy`` the bits never share memory with ``t``; without it they may (CPU tensors)."""
    import torch

    t = t.detach()
    if dtype is not None and str(t.dtype) != f"torch.{dtype}":
        t = t.to(getattr(torch, dtype_info(dtype, tensor=name).torch))
        copy = False  # the cast already made a new tensor
    name_ = str(t.dtype).removeprefix("torch.")
    info = dtype_info(name_, tensor=name)
    if t.device.type != "cpu":
        t = t.to("cpu")
    elif copy:
        t = t.clone(memory_format=torch.contiguous_format)
    if not t.is_contiguous():
        t = t.contiguous()
    signed = torch.int16 if info.bits.itemsize == 2 else torch.int32
    return info.name, t.view(signed).numpy().view(info.bits)


def as_bits(x: Any, *, name: str = "", copy: bool = True, dtype: str | None = None
            ) -> tuple[str, np.ndarray]:
    """(dtype name, raw bits) of a torch tensor or numpy array; a private copy by default."""
    if is_torch(x):
        return torch_bits(x, name=name, copy=copy, dtype=dtype)
    if not isinstance(x, np.ndarray):
        raise WeightIntegrityError(
            f"tensor {name!r}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    kind, bits = numpy_bits(x, name=name)
    if dtype is not None and dtype != kind:
        raise WeightIntegrityError(
            f"tensor {name!r}: numpy arrays are not cast; got {kind}, serving dtype is {dtype}")
    if copy or not bits.flags.c_contiguous:
        bits = np.array(bits, order="C", copy=True)
    return kind, bits


def bits_dict(tensors: Mapping[str, Any], *, copy: bool = True, dtype: str | None = None
              ) -> dict[str, tuple[str, np.ndarray]]:
    """:func:`as_bits` over a mapping of name → tensor."""
    return {n: as_bits(t, name=n, copy=copy, dtype=dtype) for n, t in tensors.items()}
