"""LoRA adapters on the rollout side (astraflow.weights.adapter): merges from the pristine base
(no rounding carried from one version to the next), the routing target, peft's folder format."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from astraflow.core.errors import WeightIntegrityError
from astraflow.core.records import AdapterSpec, WeightManifest, decode, encode
from astraflow.weights.adapter import (
    AdapterTarget,
    PristineBase,
    merge_lora,
    module_pairs,
    write_adapter_dir,
)
from astraflow.weights.target import DictTarget

SPEC = AdapterSpec(r=2, alpha=6.0, target_modules=["q_proj"], base_model="tiny")


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.q_proj = torch.nn.Linear(8, 6, bias=False)


def adapter(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"base_model.model.model.q_proj.lora_A.weight": torch.randn(2, 8, generator=g),
            "base_model.model.model.q_proj.lora_B.weight": torch.randn(6, 2, generator=g)}


def test_merge_is_from_the_pristine_base_every_version() -> None:
    """bf16 weights: merging v1, v2, v3 in turn gives the same bits as merging v3 alone (an
    in-place W += Δv - Δ(v-1) would carry each version's rounding into the next)."""
    torch.manual_seed(0)
    model = Tiny().to(torch.bfloat16)
    fresh = copy.deepcopy(model)
    w0 = model.model.q_proj.weight.detach().clone()
    base = PristineBase()
    for v in (1, 2, 3):
        assert merge_lora(model, SPEC, adapter(v), base) == 1
    merge_lora(fresh, SPEC, adapter(3), PristineBase())
    assert torch.equal(model.model.q_proj.weight, fresh.model.q_proj.weight)
    a = adapter(3)
    want = (w0.float() + 3.0 * a["base_model.model.model.q_proj.lora_B.weight"]
            @ a["base_model.model.model.q_proj.lora_A.weight"]).to(torch.bfloat16)
    assert torch.equal(model.model.q_proj.weight, want)
    assert torch.equal(base.weights["model.q_proj.weight"], w0)


def test_merge_refuses_an_adapter_of_another_model() -> None:
    with pytest.raises(WeightIntegrityError, match="no 'model.k_proj.weight'"):
        merge_lora(Tiny(), SPEC, {k.replace("q_proj", "k_proj"): v
                                  for k, v in adapter(1).items()}, PristineBase())
    bad = adapter(1)
    bad["base_model.model.model.q_proj.lora_A.weight"] = torch.zeros(2, 5)
    with pytest.raises(WeightIntegrityError, match="do not fit"):
        merge_lora(Tiny(), SPEC, bad, PristineBase())
    with pytest.raises(WeightIntegrityError, match="has no"):
        module_pairs({"base_model.model.x.lora_A.weight"})


def test_target_keeps_adapters_on_the_host_and_passes_the_rest() -> None:
    inner = DictTarget({"w": np.zeros(3, np.float32)})
    taken: list[tuple[AdapterSpec, list[str], int]] = []
    t = AdapterTarget(inner, lambda spec, tensors, v: taken.append((spec, sorted(tensors), v)))
    t.apply("w", "float32", (3,), np.array([1, 2, 3], np.float32).view(np.uint32))
    name = "base_model.model.q.lora_A.weight"
    t.apply(name, "bfloat16", (2, 2), np.arange(4, dtype=np.uint16))
    t.apply(name.replace("lora_A", "lora_B"), "bfloat16", (2, 2), np.ones(4, np.uint16))
    assert t.host_bits(name)[0] == "bfloat16" and inner.tensors["w"].tolist() == [1, 2, 3]
    assert t.host_bits("w") is not None
    t.set_adapter(SPEC)
    t.finish_version(4)
    assert taken == [(SPEC, [name, name.replace("lora_A", "lora_B")], 4)]
    assert t.current_version() == 4 == inner.version
    t.finish_version(5)  # nothing changed: the adapter is not handed over again
    assert len(taken) == 1


def test_adapter_tensors_without_a_spec_are_refused() -> None:
    t = AdapterTarget(DictTarget(), lambda *a: None)
    t.apply("base_model.model.q.lora_A.weight", "bfloat16", (1,), np.ones(1, np.uint16))
    with pytest.raises(WeightIntegrityError, match="no adapter spec"):
        t.finish_version(1)


def test_folder_is_what_peft_loads(tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=17, hidden_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(cfg)
    trained = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False))
    sd = peft.get_peft_model_state_dict(trained)
    bits = {n: ("float32", tuple(t.shape), t.detach().numpy().view(np.uint32).reshape(-1))
            for n, t in sd.items()}
    spec = AdapterSpec(r=2, alpha=4.0, target_modules=["q_proj"], base_model="b")
    path = write_adapter_dir(tmp_path / "a", spec, bits)
    assert json.loads((path / "adapter_config.json").read_text())["peft_type"] == "LORA"
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(path))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, trained(input_ids=ids).logits)


def test_manifest_carries_the_spec_and_old_manifests_decode() -> None:
    m = WeightManifest(policy="p", version=1, kind="full", codec="c", tensors=[],
                       total_bytes=0, full_bytes=0, adapter=SPEC)
    assert decode(encode(m), WeightManifest).adapter == SPEC
    plain = WeightManifest(policy="p", version=1, kind="full", codec="c", tensors=[],
                           total_bytes=0, full_bytes=0)
    import msgspec

    old = {k: v for k, v in msgspec.msgpack.decode(encode(plain)).items() if k != "adapter"}
    assert decode(msgspec.msgpack.encode(old), WeightManifest).adapter is None


def test_another_adapter_replaces_the_old_tensors() -> None:
    taken: list[list[str]] = []
    t = AdapterTarget(DictTarget(), lambda spec, tensors, v: taken.append(sorted(tensors)))
    q = "base_model.model.q.lora_A.weight", "base_model.model.q.lora_B.weight"
    k = tuple(n.replace(".q.", ".k.") for n in q)
    for name in q:
        t.apply(name, "bfloat16", (2, 2), np.ones(4, np.uint16))
    t.set_adapter(SPEC)
    t.finish_version(1)
    for name in k:  # a full snapshot of an adapter on k only
        t.apply(name, "bfloat16", (2, 2), np.ones(4, np.uint16))
    t.set_adapter(AdapterSpec(r=2, alpha=6.0, target_modules=["k"], base_model="tiny"))
    t.finish_version(2)
    assert taken == [sorted(q), sorted(k)]
