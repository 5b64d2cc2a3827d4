"""LoRA versions on the hf engines and the evaluator: a published adapter (publisher -> syncer)
is merged into the model; the hf engine in its own process decodes with it too."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from astraflow.consumers.rollout.engines import GenRequest, build_engine
from astraflow.core.bus import Bus
from astraflow.core.records import AdapterSpec
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore
from astraflow.weights.syncer import Syncer

peft = pytest.importorskip("peft")
SPEC = dict(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"])


def publish_adapter(bus: Bus, store: FileStore, arith_dir: Path) -> Any:
    """A random adapter over the arith model, published as version 1; the peft model."""
    from astraflow.models.tiny import load

    base, _ = load(arith_dir)
    torch.manual_seed(3)
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    pub = Publisher(bus, run="l", policy="default", store=store, dtype="float32")
    pub.adapter = AdapterSpec(**SPEC, base_model=str(arith_dir))
    pub.publish(peft.get_peft_model_state_dict(model), 1)
    pub.close()
    return model


@pytest.mark.slow  # starts an engine process: ~15 s alone, a minute on busy 2 cores
def test_hf_engine_in_its_own_process_decodes_with_the_adapter(
        bus: Bus, tmp_path: Path, arith_dir: Path) -> None:
    store = FileStore(tmp_path / "w")
    lora = publish_adapter(bus, store, arith_dir)
    engines = {p: build_engine("hf", model_path=arith_dir, threads=1, seed=1, process=p,
                               **({"dtype": "float32"} if p else {})) for p in (False, True)}
    try:
        for e in engines.values():
            syncer = Syncer(bus, run="l", policy="default", store=store,
                            target=e.weight_target())
            assert e.update_weights(lambda s=syncer: s.sync_once(timeout=5)) == 1
            assert e.version == 1
            syncer.close()
        merged = copy.deepcopy(lora).merge_and_unload().eval()
        ids = torch.tensor([[1, 4, 13, 5, 16, 6]])
        with torch.no_grad():
            want = merged(input_ids=ids).logits
            for e in engines.values():
                assert torch.allclose(e.model(input_ids=ids).logits, want, atol=1e-5)
        reqs = [GenRequest([1, 4, 13, 5, 16], max_new_tokens=3, temperature=0.0)]
        a, b = (engines[p].generate(reqs)[0] for p in (False, True))
        assert a.token_ids == b.token_ids and b.versions == [1] * len(b.token_ids)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5
    finally:
        for e in engines.values():
            e.close()


def test_evaluator_target_merges_adapters(bus: Bus, tmp_path: Path, arith_dir: Path) -> None:
    from astraflow.consumers.rollout.engines.target import ModelTarget
    from astraflow.models.tiny import load
    from astraflow.weights.adapter import merging_target

    store = FileStore(tmp_path / "w")
    lora = publish_adapter(bus, store, arith_dir)
    model, _ = load(arith_dir)
    target = merging_target(model, ModelTarget(model))
    syncer = Syncer(bus, run="l", policy="default", store=store, target=target)
    assert syncer.sync_once(timeout=5) == 1 and target.version == 1
    syncer.close()
    merged = copy.deepcopy(lora).merge_and_unload().eval()
    ids = torch.tensor([[1, 4, 13, 5, 16, 6]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, merged(input_ids=ids).logits,
                              atol=1e-5)
