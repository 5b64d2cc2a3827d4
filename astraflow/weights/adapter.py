"""LoRA adapters on the rollout side: where adapter tensors land and how engines apply them.

The syncer treats adapter tensors like any others; only where they land differs.
:class:`AdapterTarget` wraps an engine's weight target, keeps adapter tensors on the host and
hands the whole adapter to the engine's ``on_adapter`` callback when it changed. The ``hf``
engine merges with :func:`merge_lora` from a pristine base (:class:`PristineBase`); the
``vllm`` and ``openai`` engines load :func:`write_adapter_dir`'s peft folder
(docs/trainer.md#lora)."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from astraflow.core.errors import WeightIntegrityError
from astraflow.core.records import AdapterSpec
from astraflow.weights.bits import dtype_info

PREFIX = "base_model.model."
_A, _B = ".lora_A.weight", ".lora_B.weight"

#: the engine's callback: (spec, {name: (dtype, shape, flat bits)}, version)
OnAdapter = Callable[[AdapterSpec, dict[str, tuple[str, tuple[int, ...], np.ndarray]], int],
                     None]


def is_adapter_tensor(name: str) -> bool:
    """Whether ``name`` is a LoRA adapter tensor (peft's adapter state-dict naming)."""
    return name.endswith((_A, _B))


def module_pairs(names: list[str] | set[str]) -> dict[str, tuple[str, str]]:
    """Base-model module name (``model.layers.0.self_attn.q_proj``) -> (A name, B name)."""
    pairs: dict[str, tuple[str, str]] = {}
    for n in names:
        if n.endswith(_A):
            module = n[: -len(_A)].removeprefix(PREFIX)
            b = n[: -len(_A)] + _B
            if b not in names:
                raise WeightIntegrityError(f"adapter tensor {n!r} has no {b!r}")
            pairs[module] = (n, b)
    return pairs


def fingerprint(model_dir: str | Path) -> str:
    """A cheap identity of a base model directory: sha256 over its config.json and each
    safetensors file's header (tensor names, shapes, dtypes, offsets) and size. It does not read
    the weights (seconds for a 70B model would be hours of hashing): two directories with the
    same layout but other values share it, which a renamed copy of the same model does too."""
    d = Path(model_dir)
    h = hashlib.sha256()
    cfg = d / "config.json"
    if cfg.is_file():
        h.update(cfg.read_bytes())
    for f in sorted(d.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            h.update(f.name.encode() + fh.read(min(n, 1 << 26)))
        h.update(str(f.stat().st_size).encode())
    return h.hexdigest()


def _torch_from_bits(dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> Any:
    import torch

    words = np.ascontiguousarray(bits).reshape(shape)
    if dtype_info(dtype).bits.itemsize == 2:
        return torch.from_numpy(words.view(np.int16)).view(getattr(torch, dtype))
    return torch.from_numpy(words.view(np.int32)).view(torch.float32)


def adapter_tensors_torch(tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]]
                          ) -> dict[str, Any]:
    """The adapter's tensors as torch tensors (sharing the bits' memory)."""
    return {n: _torch_from_bits(d, s, b) for n, (d, s, b) in tensors.items()}


class PristineBase:
    """The base weights of the modules an adapter targets, as they were before any merge.

    Kept (copied) at the first merge that touches a module, in the model's own dtype and on
    its device: one extra copy of the targeted matrices (e.g. 4 of 7 linear layers per block
    with q/k/v/o), not of the model. Every merge recomputes from here, so a weight after
    version v's merge is exactly ``round(W0 + s * B_v @ A_v)``, whatever came before."""

    def __init__(self) -> None:
        self.weights: dict[str, Any] = {}

    def get(self, name: str, param: Any) -> Any:
        if name not in self.weights:
            self.weights[name] = param.detach().clone()
        return self.weights[name]


def merge_lora(model: Any, spec: AdapterSpec, tensors: dict[str, Any],
               base: PristineBase) -> int:
    """Write ``W0 + (alpha / r) * B @ A`` into every module the adapter names; returns how
    many. The product is computed in fp32 from the pristine ``W0`` and rounded once into the
    weight's dtype (peft's own merge computes in the weight's dtype)."""
    import torch

    params = dict(model.named_parameters())
    scale = spec.alpha / spec.r
    merged = 0
    with torch.no_grad():
        for module, (a_name, b_name) in sorted(module_pairs(set(tensors)).items()):
            wname = f"{module}.weight"
            w = params.get(wname)
            if w is None:
                raise WeightIntegrityError(
                    f"the adapter targets {module!r}, but the rollout model has no {wname!r}; "
                    f"the adapter was trained on {spec.base_model!r}: serve that model")
            a, b = tensors[a_name].float(), tensors[b_name].float()
            if b.shape[0] != w.shape[0] or a.shape[1] != w.shape[1] or a.shape[0] != b.shape[1]:
                raise WeightIntegrityError(
                    f"adapter of {module!r}: A {tuple(a.shape)} and B {tuple(b.shape)} do not "
                    f"fit its weight {tuple(w.shape)}")
            w0 = base.get(wname, w)
            delta = (b.to(w.device) @ a.to(w.device)) * scale
            w.copy_((w0.float() + delta).to(w.dtype))
            merged += 1
    return merged


def adapter_config(spec: AdapterSpec) -> dict[str, Any]:
    """peft's ``adapter_config.json`` for ``spec`` (what vLLM and SGLang read)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.r,
            "lora_alpha": spec.alpha, "lora_dropout": 0.0, "bias": "none",
            "target_modules": list(spec.target_modules), "fan_in_fan_out": False,
            "base_model_name_or_path": spec.base_model, "modules_to_save": None,
            "use_rslora": False, "use_dora": False, "inference_mode": True}


def write_adapter_dir(path: str | Path, spec: AdapterSpec,
                      tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]]) -> Path:
    """Write the adapter as peft saves one: ``adapter_model.safetensors`` (peft's names) and
    ``adapter_config.json``, into ``path`` (created)."""
    from astraflow.weights.safetensors_io import write_safetensors

    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    write_safetensors(p / "adapter_model.safetensors",
                      {n: (d, np.ascontiguousarray(b).reshape(s))
                       for n, (d, s, b) in tensors.items()})
    (p / "adapter_config.json").write_text(json.dumps(adapter_config(spec), indent=1))
    return p


class AdapterTarget:
    """A :class:`~astraflow.weights.target.WeightTarget` that keeps adapter tensors on the
    host and passes every other tensor to ``inner`` (the engine's target for full weights), so
    one engine follows a full-weight trainer and a LoRA trainer alike. At
    :meth:`finish_version` of a version whose manifest carried an adapter spec (:meth:`set_adapter`, called by the syncer
    before it), ``on_adapter`` gets the adapter when any of its tensors changed."""

    def __init__(self, inner: Any, on_adapter: OnAdapter) -> None:
        self.inner = inner
        self.on_adapter = on_adapter
        self.adapter_tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
        self.spec: AdapterSpec | None = None
        self.adapter_version: int | None = None  # the version on_adapter last took
        self._changed = False
        self._applied: set[str] = set()  # adapter tensors applied since the last finished version

    @property
    def version(self) -> int | None:
        return self.inner.current_version()

    def __getattr__(self, name: str) -> Any:
        # the wrapped target's own attributes (ModelTarget.tensors, HostTarget.bits, ...): code
        # that knew the engine's target keeps working through the wrapper
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def current_version(self) -> int | None:
        return self.inner.current_version()

    def set_adapter(self, spec: AdapterSpec | None) -> None:
        """The spec of the manifest being applied (None: full weights); called after its
        tensors were applied, before :meth:`finish_version`."""
        if spec is not None and self.spec is not None and spec != self.spec:
            # another adapter (a trainer restarted with other target modules or rank): its
            # version is a full snapshot (the tensor set changed), so what it did not write
            # belongs to the old adapter
            for name in set(self.adapter_tensors) - self._applied:
                del self.adapter_tensors[name]
        self.spec = spec

    def host_bits(self, name: str) -> tuple[str, np.ndarray] | None:
        if is_adapter_tensor(name):
            held = self.adapter_tensors.get(name)
            return None if held is None else (held[0], held[2])
        return self.inner.host_bits(name)

    def apply(self, name: str, dtype: str, shape: tuple[int, ...], bits: np.ndarray) -> None:
        if not is_adapter_tensor(name):
            self.inner.apply(name, dtype, shape, bits)
            return
        held = self.adapter_tensors.get(name)
        if held is None or not np.shares_memory(held[2], bits):
            bits = np.array(bits, copy=True).reshape(-1)
        self.adapter_tensors[name] = (dtype, tuple(shape), bits)
        self._applied.add(name)
        self._changed = True

    def finish_version(self, version: int) -> None:
        if self.adapter_tensors and (self._changed or self.adapter_version is None):
            if self.spec is None:
                raise WeightIntegrityError(
                    f"version {version} holds LoRA adapter tensors but its manifest has no "
                    "adapter spec (r, alpha): a trainer of an older build? Upgrade it")
            self.on_adapter(self.spec, self.adapter_tensors, version)
            self.adapter_version = version
            self._changed = False
        self._applied.clear()
        self.inner.finish_version(version)


def merged_weights(base: dict[str, Any], adapter: dict[str, Any], scale: float
                   ) -> dict[str, Any]:
    """``base`` (a model's state dict, torch tensors) with every module the ``adapter`` names
    (peft's names, with or without the adapter name ``.default``) merged: ``W0 + scale·B·A``,
    in fp32, rounded once into ``W0``'s dtype. For exporting a LoRA trainer's checkpoint as a
    plain model directory."""
    names = {n.replace(".default.", "."): t for n, t in adapter.items()}
    out = dict(base)
    for module, (a_name, b_name) in module_pairs(set(names)).items():
        key = f"{module}.weight"
        if key not in base:
            raise WeightIntegrityError(f"the adapter targets {module!r}, but the base has no "
                                       f"{key!r}")
        w0 = base[key]
        delta = names[b_name].float() @ names[a_name].float()
        out[key] = (w0.float() + scale * delta).to(w0.dtype).contiguous()
    return out


def merging_target(model: Any, inner: Any) -> AdapterTarget:
    """``inner`` (a target over ``model``'s weights) taking adapters too: each adapter
    version is merged into ``model`` from its pristine base (:func:`merge_lora`). What the hf
    engines and the evaluator follow a LoRA trainer with."""
    import logging

    base = PristineBase()
    log = logging.getLogger("astraflow.weights.adapter")

    def merge(spec: AdapterSpec, tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]],
              version: int) -> None:
        n = merge_lora(model, spec, adapter_tensors_torch(tensors), base)
        log.info("merged LoRA adapter version=%d into %d modules (r=%d alpha=%g)", version, n,
                 spec.r, spec.alpha)

    return AdapterTarget(inner, merge)
