"""Where a syncer puts weights: the :class:`WeightTarget` protocol and a dict-of-tensors target.

An inference engine implements :class:`WeightTarget` to receive each changed tensor's new bits
(e.g. to copy them to the GPU or call its ``load_weights``). A target that keeps a tensor in
host memory returns a writable view of its raw bits from :meth:`~WeightTarget.host_bits`; the
syncer then applies deltas in place there. Otherwise the syncer keeps a host copy (the shadow)
to apply deltas to, and hands the target the result.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from astraflow.core.errors import WeightIntegrityError
from astraflow.weights.bits import dtype_info, is_torch, numpy_bits


@runtime_checkable
class WeightTarget(Protocol):
    def current_version(self) -> int | None:
        """The version the target holds (None: none yet, or unknown)."""

    def host_bits(self, name: str) -> tuple[str, np.ndarray] | None:
        """(dtype, writable flat raw-bit view) of tensor ``name`` if the target holds it in host
        memory, else None. Writes to the view must change the tensor."""

    def apply(self, name: str, dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> None:
        """Take the verified new bits of one tensor (flat words; may be the very view
        :meth:`host_bits` returned, already updated). Called only for tensors that changed."""

    def finish_version(self, version: int) -> None:
        """Every tensor of ``version`` has been applied."""


def _host_view(t: Any) -> tuple[str, np.ndarray] | None:
    if is_torch(t):
        if t.device.type != "cpu" or not t.is_contiguous():
            return None
        name = str(t.dtype).removeprefix("torch.")
        if name not in ("bfloat16", "float16", "float32"):
            return None
        import torch

        signed = torch.int32 if name == "float32" else torch.int16
        return name, t.detach().view(signed).numpy().view(dtype_info(name).bits).reshape(-1)
    if isinstance(t, np.ndarray) and t.flags.c_contiguous and t.flags.writeable:
        kind, bits = numpy_bits(t)
        return kind, bits.reshape(-1)
    return None


class DictTarget:
    """A dict of tensors (torch or numpy) updated in place. CPU tensors are written through
    views (no copy); GPU tensors are copied to. Missing tensors are created, as torch tensors
    when ``torch`` (default: when the dict holds any) or as numpy arrays (bf16: uint16 bits)."""

    def __init__(self, tensors: MutableMapping[str, Any] | None = None, *,
                 version: int | None = None, torch: bool | None = None) -> None:
        self.tensors: MutableMapping[str, Any] = tensors if tensors is not None else {}
        self.version = version
        self.torch = torch if torch is not None else any(map(is_torch, self.tensors.values()))

    def current_version(self) -> int | None:
        return self.version

    def host_bits(self, name: str) -> tuple[str, np.ndarray] | None:
        t = self.tensors.get(name)
        return None if t is None else _host_view(t)

    def apply(self, name: str, dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> None:
        info = dtype_info(dtype, tensor=name)
        old = self.tensors.get(name)
        if old is not None and tuple(old.shape) == tuple(shape):
            view = _host_view(old)
            if view is not None and view[0] == dtype:
                if not np.shares_memory(view[1], bits):
                    view[1][:] = bits
                return
            if is_torch(old) and str(old.dtype) == f"torch.{dtype}":
                old.copy_(_to_torch(bits, info.torch, shape))
                return
        if self.torch:
            self.tensors[name] = _to_torch(bits, info.torch, shape)
        elif dtype == "bfloat16":
            self.tensors[name] = bits.reshape(shape)
        else:
            self.tensors[name] = bits.view(np.float16 if dtype == "float16" else np.float32
                                           ).reshape(shape)

    def finish_version(self, version: int) -> None:
        self.version = version


def _to_torch(bits: np.ndarray, dtype: str, shape: tuple[int, ...]) -> Any:
    import torch

    if bits.dtype.itemsize not in (2, 4):
        raise WeightIntegrityError(f"cannot make a torch {dtype} tensor from {bits.dtype} words")
    signed = bits.view(np.int16 if bits.dtype.itemsize == 2 else np.int32)
    return torch.from_numpy(signed).view(getattr(torch, dtype)).reshape(shape)
