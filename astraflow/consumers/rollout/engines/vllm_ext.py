"""vLLM worker extension (``worker_extension_cls``): loads weight tensors in place.

Runs inside vLLM's worker processes, where ``self`` is the vLLM worker; imported by vLLM by
its dotted path, so it imports nothing from vLLM at module level."""

from __future__ import annotations

from typing import Any


class WeightLoader:
    def af_load_weights(self, tensors: list[tuple[str, str, list[int], bytes]]) -> int:
        """Load (name, dtype, shape, raw bytes) tensors with the model's ``load_weights``."""
        import torch

        model: Any = self.model_runner.model  # type: ignore[attr-defined]
        device = next(model.parameters()).device
        weights = [(name, torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype))
                    .reshape(shape).to(device)) for name, dtype, shape, data in tensors]
        model.load_weights(weights=weights)
        return len(weights)
