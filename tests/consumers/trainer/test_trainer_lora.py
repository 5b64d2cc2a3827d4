"""LoRA on the trainer (trainer.lora): only the adapter trains, has optimizer state, is
checkpointed and resumes exactly; the base weights never move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import random_batch

from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.checkpoint import CheckpointDir, CheckpointMeta
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.errors import ConfigError

pytest.importorskip("peft")

LORA = {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}


def lora_state(tiny_dir: Path, **lora: object):
    return build_train_state(TrainerConfig(device="cpu", optimizer={"lr": 1e-2},
                                      lora={**LORA, **lora}), tiny_dir)


def test_only_adapter_params_train_and_have_optimizer_state(tiny_dir: Path) -> None:
    e = lora_state(tiny_dir)
    trainable = {n for n, p in e.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    base = {n: p.detach().clone() for n, p in e.model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in e.model.named_parameters() if p.requires_grad}
    for v in range(3):
        rl_step(e, random_batch(v), v)
    # AdamW state exists for exactly the adapter parameters
    by_id = {id(p): n for n, p in e.model.named_parameters()}
    with_state = {by_id[id(p)] for p in e.optimizer.state}
    assert with_state == trainable
    for st in e.optimizer.state.values():
        assert {"exp_avg", "exp_avg_sq"} <= set(st)
    for n, p in e.model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), f"frozen base weight {n} moved"
            assert p.grad is None
    assert any(not torch.equal(p, adapters[n]) for n, p in e.model.named_parameters()
               if n in adapters), "the adapter did not move"
    # what is published: peft's adapter names, lora_A/lora_B only, marked with its spec
    published = e.state_tensors()
    assert published and all(k.startswith("base_model.model.") and
                             k.endswith((".lora_A.weight", ".lora_B.weight")) for k in published)
    assert e.adapter is not None and e.adapter.r == 4 and e.adapter.alpha == 8.0
    assert e.adapter.target_modules == ["q_proj", "v_proj"]
    assert e.adapter.base_model == str(tiny_dir) and len(e.adapter.base_fingerprint) == 64


def test_checkpoint_holds_the_adapter_and_resumes_exactly(tiny_dir: Path,
                                                          tmp_path: Path) -> None:
    e = lora_state(tiny_dir)
    for v in range(2):
        rl_step(e, random_batch(v), v)
    ckpts = CheckpointDir(tmp_path, run="r", policy="p")
    path = ckpts.save(e.model, e.optimizer, CheckpointMeta(version=2))
    from safetensors.torch import load_file

    saved = load_file(str(path / "model.safetensors"))
    assert set(saved) == {n for n, p in e.model.named_parameters() if p.requires_grad}
    full = sum(p.numel() for p in e.model.parameters())
    assert sum(t.numel() for t in saved.values()) < 0.2 * full

    fresh = lora_state(tiny_dir)  # another adapter init: the checkpoint must replace it
    torch.manual_seed(99)
    assert ckpts.load(fresh.model, fresh.optimizer) is not None
    for (n, a), b in zip(e.model.state_dict().items(), fresh.model.state_dict().values(),
                         strict=True):
        assert torch.equal(a, b), n
    rl_step(e, random_batch(7), 2)
    rl_step(fresh, random_batch(7), 2)
    for (n, a), b in zip(e.model.state_dict().items(), fresh.model.state_dict().values(),
                         strict=True):
        assert torch.equal(a, b), n


def test_the_kl_reference_of_a_lora_model_is_its_base(tiny_dir: Path) -> None:
    """With ``loss.kl`` on, a LoRA trainer holds no second model: its reference is the base
    (the adapter switched off). It computes what a separate frozen copy of the base computes,
    step for step, and the KL starts at exactly 0 (a fresh adapter adds zero)."""
    from astraflow.consumers.trainer.build import load_model

    def train_state():
        return build_train_state(TrainerConfig(device="cpu", optimizer={"lr": 1e-2}, lora=LORA,
                                          loss={"kl": "k3", "kl_coef": 0.5}), tiny_dir)

    own, copy = train_state(), train_state()
    assert own.ref_model is None  # no second copy held
    copy.ref_model, _ = load_model(tiny_dir, torch.device("cpu"))
    copy.ref_model.eval().requires_grad_(False)
    kls = []
    for v in range(3):
        a, b = rl_step(own, random_batch(v), v), rl_step(copy, random_batch(v), v)
        assert a["loss"] == b["loss"] and a["kl"] == b["kl"], (v, a, b)
        kls.append(a["kl"])
    assert kls[0] == 0.0 and kls[-1] > 0.0, kls
    # the adapter is on again after the reference forwards: the model is not its base
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        on = own.model(input_ids=ids).logits
        with own.model.disable_adapter():
            off = own.model(input_ids=ids).logits
    assert not torch.equal(on, off)


def test_unknown_target_module_names_the_linear_layers(tiny_dir: Path) -> None:
    with pytest.raises(ConfigError, match="q_proj"):
        lora_state(tiny_dir, target_modules=["attn_qkv"])


def test_lora_config_validation() -> None:
    assert TrainerConfig().lora is None
    with pytest.raises(ValueError):
        TrainerConfig(lora={"r": 0})
    with pytest.raises(ValueError):
        TrainerConfig(lora={"target_modules": []})


def test_rl_steps_through_the_loop_publish_adapters_a_rollout_engine_merges(
        experiment: Any, tmp_path: Path, tiny_dir: Path) -> None:
    """The real trainer loop with LoRA: the base never moves, every published version is an
    adapter marked as one, and an hf rollout engine fed those versions computes the logits of
    the trainer's merged model."""
    import copy

    from safetensors.torch import load_file
    from trainer_helpers import produce

    from astraflow.consumers.rollout.engines.hf import HFEngine
    from astraflow.run.resources import open_bus
    from astraflow.run.roles import configured_trainer
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore
    from astraflow.weights.syncer import Syncer

    cfg = experiment(trainer={"max_steps": 3, "checkpoint_every": 3, "lora": LORA,
                              "optimizer": {"lr": 1e-2}})
    bus = open_bus(cfg, tmp_path)
    produce(bus, cfg.run, [random_batch(s) for s in range(3)])
    store = FileStore(tmp_path / "weights")
    # float32 on the wire: the merge is then compared with the trainer's, not with bf16 rounding
    publisher = Publisher(bus, run=cfg.run, policy="default", store=store, dtype="float32")
    trainer = configured_trainer(cfg, "default", tmp_path, bus=bus, publisher=publisher)
    try:
        assert trainer.run(timeout=60).version == 3
    finally:
        trainer.close()
        publisher.close()
    base = load_file(str(tiny_dir / "model.safetensors"))
    model = trainer.state.model
    for n, p in model.named_parameters():
        if not p.requires_grad:
            key = n.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(p, base[key]), f"base weight {n} changed"
    manifests = publisher.last_manifests
    assert manifests and all(m.adapter is not None and m.adapter.r == 4 for m in manifests)
    assert all(".lora_" in t.name for m in manifests for t in m.tensors)

    engine = HFEngine(tiny_dir, dtype="float32")
    syncer = Syncer(bus, run=cfg.run, policy="default", store=store,
                    target=engine.weight_target(), cache_dir=tmp_path / "cache")
    assert engine.update_weights(lambda: syncer.sync_once(timeout=5)) == 3
    assert engine.version == 3
    merged = copy.deepcopy(model).merge_and_unload().eval()
    ids = torch.tensor([[1, 4, 13, 5, 16, 6], [1, 9, 14, 3, 16, 12]])
    with torch.no_grad():
        want = merged(input_ids=ids).logits
        got = engine.model(input_ids=ids).logits
        with model.disable_adapter():
            before = model.eval()(input_ids=ids).logits
    assert (want - before).abs().max() > 1e-3, "the adapter did not change the model"
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    syncer.close()
    bus.close()


def test_exported_checkpoint_is_the_merged_model(tiny_dir: Path, tmp_path: Path) -> None:
    """`astraflow run`'s export of a LoRA checkpoint (adapter only) is a plain model directory
    with the adapter merged: its logits are peft's merged model's."""
    import copy

    from transformers import AutoModelForCausalLM

    from astraflow.run.launch import export_model

    e = lora_state(tiny_dir)
    for v in range(2):
        rl_step(e, random_batch(v), v)
    path = CheckpointDir(tmp_path / "ck", run="r", policy="p").save(
        e.model, e.optimizer, CheckpointMeta(version=2))
    dest = export_model(path, tiny_dir, tmp_path / "final", lora_scale=8.0 / 4)
    exported = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).eval()
    merged = copy.deepcopy(e.model).merge_and_unload().eval()
    ids = torch.tensor([[1, 4, 13, 5, 16, 6]])
    with torch.no_grad():
        want, got = merged(input_ids=ids).logits, exported(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
