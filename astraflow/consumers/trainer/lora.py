"""LoRA on the trainer (``trainer.lora``): wrap the model with peft, train and publish the adapter.

:func:`wrap` makes the loaded model a peft ``PeftModelForCausalLM`` with frozen base weights, so
only ``lora_A`` / ``lora_B`` get gradients and AdamW state; B starts at zero, so the wrapped
model starts equal to the base. Only the adapter leaves the trainer: :func:`adapter_tensors`
to the publisher (its manifest marked by :func:`spec`), the trainable tensors to checkpoints.
Under fsdp the model is wrapped before it is sharded (docs/trainer.md#lora).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.core.errors import ConfigError
from astraflow.core.records import AdapterSpec

if TYPE_CHECKING:
    import torch

    from astraflow.consumers.trainer.config import LoraSection


def wrap(model: torch.nn.Module, lora: LoraSection) -> Any:
    """``model`` as a peft LoRA model: base frozen, adapters on ``lora.target_modules``."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError("trainer.lora needs peft: pip install 'astraflow[lora]' "
                          "(or pip install 'peft>=0.17,<1')") from None
    targets: Any = lora.target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    alpha: Any = lora.alpha  # peft annotates an int; the scale alpha / r takes a float too
    config = LoraConfig(r=lora.r, lora_alpha=alpha, lora_dropout=lora.dropout,
                        target_modules=targets, bias="none", task_type="CAUSAL_LM")
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if type(m).__name__ == "Linear"})
        raise ConfigError(f"trainer.lora.target_modules={lora.target_modules}: {e}; linear "
                          f"modules of this model: {names}") from None
    return peft_model


def is_lora(model: Any) -> bool:
    return getattr(model, "peft_config", None) is not None


def adapter_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors by peft's adapter state-dict names (what a saved adapter holds)."""
    from peft import get_peft_model_state_dict

    return dict(get_peft_model_state_dict(model))


def spec(model: Any, model_path: str | Path) -> AdapterSpec:
    """The manifest's mark of this adapter: r, alpha, the target modules as peft resolved them,
    and the base model's name and fingerprint (:func:`astraflow.weights.adapter.fingerprint`)."""
    from astraflow.weights.adapter import fingerprint

    cfg = model.peft_config["default"]
    return AdapterSpec(r=int(cfg.r), alpha=float(cfg.lora_alpha),
                       target_modules=sorted(cfg.target_modules),
                       base_model=str(model_path), base_fingerprint=fingerprint(model_path))
