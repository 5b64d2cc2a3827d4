"""Several policies as LoRA adapters of one base, served by one ``hf`` engine.

For the policies ``rollout.engine.adapters`` names, the worker builds one :class:`HFEngine` of
the base with an :class:`AdapterBank`, and each policy gets an :class:`AdapterView` (its own
version, weight target and tokenizer). The views share a batcher, so rows of different adapters
share a forward pass: each targeted linear module (:class:`RoutedLinear`) adds each row's
adapter, unmerged. Versions land between decoding steps, independently per policy; a slot with
no version yet is the base.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from astraflow.core.errors import WeightIntegrityError
from astraflow.core.records import AdapterSpec
from astraflow.weights.adapter import (
    AdapterTarget,
    adapter_tensors_torch,
    is_adapter_tensor,
    module_pairs,
)

log = logging.getLogger("astraflow.rollout.adapters")

T = TypeVar("T")


@dataclass
class Slot:
    """One policy's adapter: its matrices per base module, its scale and version."""

    policy: str
    version: int | None = None
    scale: float = 0.0
    mats: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # module -> (A, B)


class AdapterBank:
    """The adapters of one engine's base model, and the routing of the batch in flight."""

    def __init__(self, model: Any, policies: Sequence[str]) -> None:
        if len(set(policies)) != len(policies) or not policies:
            raise ValueError(f"adapter policies must be distinct and not empty: {policies}")
        self.model = model
        self.slots = {p: Slot(p) for p in policies}
        self.open_views = set(policies)  # the engine closes when the last view does
        self._lock = threading.Lock()
        self.wrapped: dict[str, Any] = {}  # module name -> its RoutedLinear
        self.groups: list[tuple[Slot, Any]] = []  # (slot, row indices) of the batch in flight

    def view_closed(self, policy: str) -> bool:
        """``policy``'s view closed; True when it was the last one open."""
        with self._lock:
            self.open_views.discard(policy)
            return not self.open_views

    def slot(self, policy: str) -> Slot:
        s = self.slots.get(policy)
        if s is None:
            raise KeyError(f"policy {policy!r} is no adapter of this engine "
                           f"({', '.join(self.slots)})")
        return s

    def version(self, policy: str, initial: int) -> int:
        """The version of ``policy``'s adapter in its slot (``initial`` before any)."""
        v = self.slot(policy).version
        return initial if v is None else v

    def route(self, policies: Sequence[str]) -> None:
        """The adapter of each row of the next forward passes (in batch order; "": the base
        alone); ``[]`` ends the routing."""
        import torch

        groups: dict[str, list[int]] = {}
        for row, p in enumerate(policies):
            if p:
                groups.setdefault(p, []).append(row)
        device = next(self.model.parameters()).device
        self.groups = [(self.slot(p), torch.tensor(rows, dtype=torch.long, device=device))
                       for p, rows in groups.items()]

    def load(self, policy: str, spec: AdapterSpec, tensors: dict[str, Any],
             version: int) -> int:
        """Put ``policy``'s adapter of ``version`` in its slot (called between decoding
        steps); returns how many modules it targets."""
        slot = self.slot(policy)
        pairs = module_pairs(set(tensors))
        mats: dict[str, tuple[Any, Any]] = {}
        for module, (a_name, b_name) in pairs.items():
            layer = self._wrap(module)
            w = layer.base.weight
            a = tensors[a_name].to(device=w.device, dtype=w.dtype)
            b = tensors[b_name].to(device=w.device, dtype=w.dtype)
            if b.shape[0] != w.shape[0] or a.shape[1] != w.shape[1] or a.shape[0] != b.shape[1]:
                raise WeightIntegrityError(
                    f"adapter of {module!r}: A {tuple(a.shape)} and B {tuple(b.shape)} do not "
                    f"fit its weight {tuple(w.shape)}")
            mats[module] = (a.contiguous(), b.contiguous())
        slot.mats, slot.scale = mats, spec.alpha / spec.r
        return len(mats)

    def _wrap(self, module: str) -> Any:  # a RoutedLinear (a class made once torch loads)
        layer = self.wrapped.get(module)
        if layer is not None:
            return layer
        import torch

        try:
            base = self.model.get_submodule(module)
        except AttributeError as e:
            raise WeightIntegrityError(f"the adapter targets {module!r}, which the served "
                                       "model does not have: serve the adapter's base") from e
        if not isinstance(base, torch.nn.Linear):
            raise WeightIntegrityError(f"the adapter targets {module!r}, a "
                                       f"{type(base).__name__}; only Linear layers take LoRA")
        layer = RoutedLinear(base, module, self)
        parent, _, child = module.rpartition(".")
        setattr(self.model.get_submodule(parent) if parent else self.model, child, layer)
        self.wrapped[module] = layer
        return layer


def _routed_linear_class() -> type:
    import torch

    class _RoutedLinear(torch.nn.Module):
        """A base Linear plus, for the rows of each adapter of the batch, its LoRA update."""

        def __init__(self, base: torch.nn.Linear, name: str, bank: AdapterBank) -> None:
            super().__init__()
            self.base = base
            self.name = name
            self.bank = bank

        @property
        def weight(self) -> torch.Tensor:  # what code reading the layer's weight expects
            return self.base.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.base(x)
            for slot, rows in self.bank.groups:
                ab = slot.mats.get(self.name)
                if ab is None:
                    continue
                a, b = ab
                xs = x.index_select(0, rows)
                delta = (xs @ a.T) @ b.T * slot.scale
                out = out.index_add(0, rows, delta.to(out.dtype))
            return out

    return _RoutedLinear


_CLASS: type | None = None


def RoutedLinear(base: Any, name: str, bank: AdapterBank) -> Any:  # noqa: N802 - a class
    """A :class:`torch.nn.Module` wrapping ``base`` (see :func:`_routed_linear_class`); built
    lazily so that importing this module needs no torch."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _routed_linear_class()
    return _CLASS(base, name, bank)


class _VersionOnly:
    """The inner target of an adapter slot: it holds the version (the slot's, which the
    engine writes into each token of the slot's rows); a tensor that is not an adapter's is
    refused (the policy's trainer trains the whole model: it needs an engine of its own, not
    a slot)."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.policy = slot.policy

    def current_version(self) -> int | None:
        return self.slot.version

    def host_bits(self, name: str) -> tuple[str, np.ndarray] | None:
        return None

    def apply(self, name: str, dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> None:
        raise WeightIntegrityError(
            f"policy {self.policy!r} is served as a LoRA adapter of a shared base "
            f"(rollout.engine.adapters), but its weights carry {name!r}, a tensor of the whole "
            "model: give its trainer trainer.lora, or serve it with an engine of its own")

    def finish_version(self, version: int) -> None:
        self.slot.version = version  # an unchanged adapter keeps its matrices, moves on


class AdapterView:
    """One adapter policy's engine: the shared ``engine``'s model with this policy's adapter.
    Its version, weight target and updates are the adapter's own; generation goes to the
    shared engine with every request routed to this adapter."""

    continuous = False

    def __init__(self, engine: Any, policy: str) -> None:
        self.shared = engine  # the Runtime gives every view of one engine one batcher
        self.policy = policy
        self.name = engine.name
        self.tokenizer = engine.tokenizer
        self.max_batch_size = engine.max_batch_size
        bank: AdapterBank = engine.adapters
        self._slot = bank.slot(policy)

        def load(spec: AdapterSpec, tensors: dict[str, Any], version: int) -> None:
            n = bank.load(policy, spec, adapter_tensors_torch(tensors), version)
            log.info("policy=%s adapter version=%d in its slot (%d modules, r=%d alpha=%g)",
                     policy, version, n, spec.r, spec.alpha)

        self._target = AdapterTarget(_VersionOnly(self._slot), load)

    @property
    def version(self) -> int:
        return self.shared.adapters.version(self.policy, self.shared.initial_version)

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        import dataclasses

        return self.shared.generate([dataclasses.replace(r, adapter=self.policy)
                                     for r in requests])

    def weight_target(self) -> AdapterTarget:
        return self._target

    def update_weights(self, fn: Callable[[], T]) -> T:
        return self.shared.update_weights(fn)

    def busy_seconds(self) -> float:
        return float(self.shared.busy_seconds())

    def close(self) -> None:
        if self.shared.adapters.view_closed(self.policy):
            self.shared.close()


def adapter_views(engine: Any, policies: Sequence[str]) -> dict[str, AdapterView]:
    """A view per adapter policy of ``engine`` (an hf engine built with ``adapters``); the
    engine closes when the last view does."""
    return {p: AdapterView(engine, p) for p in policies}


__all__ = ["AdapterBank", "AdapterView", "Slot", "adapter_views", "is_adapter_tensor"]
