"""Weight targets of the rollout engines: where the syncer puts new weight versions.

:class:`ModelTarget` writes into a torch model's parameters in place. Weights are published in
bf16: a bf16 model on the CPU takes deltas straight into its memory
(:meth:`ModelTarget.host_bits`); any other model gets each changed tensor converted into the
parameter's dtype and device (:meth:`ModelTarget.apply`), so an fp32 model runs on the
bf16-rounded weights. :class:`HostTarget` keeps the bits on the host only (for a vLLM worker or a
server) and reports the tensors changed since the last hand-off.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from astraflow.core.errors import WeightIntegrityError


class ModelTarget:
    """A :class:`~astraflow.weights.target.WeightTarget` over ``model.state_dict()``."""

    def __init__(self, model: Any, *, version: int | None = None) -> None:
        self.tensors: dict[str, Any] = dict(model.state_dict(keep_vars=True))
        self.version = version
        self.applied = 0  # tensors applied since construction (tests, metrics)

    def current_version(self) -> int | None:
        return self.version

    def host_bits(self, name: str) -> tuple[str, np.ndarray] | None:
        t = self.tensors.get(name)
        if t is None or t.device.type != "cpu" or not t.is_contiguous():
            return None
        import torch

        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in ("bfloat16", "float16"):
            return None  # fp32 parameters: published bits are bf16, the syncer keeps a shadow
        return dtype, t.detach().view(torch.int16).numpy().view(np.uint16).reshape(-1)

    def apply(self, name: str, dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> None:
        import torch

        t = self.tensors.get(name)
        if t is None:
            raise WeightIntegrityError(
                f"tensor {name!r} of the published weights is not in the rollout model (it has "
                f"{len(self.tensors)} tensors, e.g. {sorted(self.tensors)[:3]}); the trainer and "
                "the rollout workers must use the same architecture")
        if tuple(t.shape) != tuple(shape):
            raise WeightIntegrityError(f"tensor {name!r}: published shape {tuple(shape)}, the "
                                       f"rollout model has {tuple(t.shape)}")
        view = self.host_bits(name)
        if view is not None and view[0] == dtype and np.shares_memory(view[1], bits):
            self.applied += 1
            return  # decoded in place
        words = np.ascontiguousarray(bits).reshape(shape)
        if dtype in ("bfloat16", "float16"):
            src = torch.from_numpy(words.view(np.int16)).view(getattr(torch, dtype))
        elif dtype == "float32":
            src = torch.from_numpy(words.view(np.int32)).view(torch.float32)
        else:
            raise WeightIntegrityError(f"tensor {name!r}: unsupported dtype {dtype!r}")
        with torch.no_grad():
            t.data.copy_(src.to(dtype=t.dtype))
        self.applied += 1

    def finish_version(self, version: int) -> None:
        self.version = version


class HostTarget:
    """Keeps every tensor's bits on the host; ``take_changed()`` hands over what changed."""

    def __init__(self, *, version: int | None = None) -> None:
        self.bits: dict[str, tuple[str, np.ndarray]] = {}
        self.version = version
        self.changed: set[str] = set()
        self.shapes: dict[str, tuple[int, ...]] = {}

    def current_version(self) -> int | None:
        return self.version

    def host_bits(self, name: str) -> tuple[str, np.ndarray] | None:
        return self.bits.get(name)

    def apply(self, name: str, dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> None:
        held = self.bits.get(name)
        if held is None or held[0] != dtype or held[1].size != bits.size or not np.shares_memory(
                held[1], bits):
            self.bits[name] = (dtype, np.array(bits, copy=True).reshape(-1))
        self.changed.add(name)
        self.shapes[name] = tuple(shape)

    def finish_version(self, version: int) -> None:
        self.version = version

    def take_changed(self) -> list[str]:
        names, self.changed = sorted(self.changed), set()
        return names
