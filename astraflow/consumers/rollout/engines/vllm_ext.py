"""vLLM worker extension (``worker_extension_cls``): loads changed weight tensors in place.

Runs inside vLLM's worker processes, where ``self`` is the vLLM worker; vLLM imports it by its
dotted path, so it imports nothing from vLLM. Tensors are loaded with the model's own
``load_weights`` (the model found through ``get_model()``, which unwraps the CUDA-graph wrapper).
That takes any subset of tensors, but only for unquantized models: deltas for a quantized model
are refused (:class:`WeightLoadError`). Checked against vLLM 0.33.0.
"""

from __future__ import annotations

from typing import Any

# (name, dtype, shape, raw bytes): one tensor as it travels through ``collective_rpc``
Payload = list[tuple[str, str, list[int], bytes]]


class WeightLoadError(RuntimeError):
    """A worker refused or failed to load weights (raised inside the vLLM worker process, so
    it does not depend on astraflow's error classes being importable there)."""


def decode(tensors: Payload) -> list[tuple[str, Any]]:
    """(name, CPU tensor) pairs from a payload, bit for bit (no dtype conversion here: the
    model's weight loaders copy into their parameters' dtype and device)."""
    import torch

    out = []
    for name, dtype, shape, data in tensors:
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise WeightLoadError(f"tensor {name!r}: unknown dtype {dtype!r}")
        t = torch.frombuffer(bytearray(data), dtype=torch_dtype)  # bytearray: writable, owned
        out.append((name, t.reshape(shape)))
    return out


class WeightLoader:
    """Mixed into vLLM's worker: ``collective_rpc("af_load_weights", args=(payload,))``."""

    def af_load_weights(self, tensors: Payload) -> int:
        """Load (name, dtype, shape, raw bytes) tensors in place; returns how many."""
        quantization = getattr(getattr(self, "model_config", None), "quantization", None)
        if quantization is not None:
            raise WeightLoadError(
                f"the model is quantized (quantization={quantization!r}): its weights cannot "
                "be updated tensor by tensor; serve an unquantized model (bf16/fp16/fp32) "
                "for rollouts that follow training")
        model: Any = self.get_model()  # type: ignore[attr-defined]
        weights = decode(tensors)
        model.load_weights(weights)
        return len(weights)
