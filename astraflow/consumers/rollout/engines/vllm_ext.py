"""vLLM worker extension (``worker_extension_cls``): loads changed weight tensors in place.

Runs inside vLLM's worker processes, where ``self`` is the vLLM worker (vLLM mixes this class
into its worker class); vLLM imports it by its dotted path, so it imports nothing from vLLM.

Checked against vLLM 0.33.0 (``vllm/v1/worker/gpu_worker.py``, ``gpu_model_runner.py``):

* The model comes from the worker's ``get_model()``, which unwraps the CUDA-graph wrapper;
  ``model_runner.model`` may be that wrapper, whose ``load_weights`` is not the model's.
* Changed tensors are loaded with the model's own ``load_weights`` (the loader of the
  checkpoint format: it maps Hugging Face names onto vLLM's fused parameters, shards for tensor
  parallelism and copies into the existing storage). That accepts any subset of tensors, so a
  delta of a few tensors works, but only for unquantized models on CUDA: a quantized model's
  parameters are in kernel format (packed, scaled), and vLLM's supported route for them,
  ``reload_weights``, reprocesses whole layers and needs every tensor of a layer in one call.
  Deltas for a quantized model are therefore refused (:class:`WeightLoadError`).
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
