"""Several policies as LoRA adapters of one base in one hf engine (rollout.engine.adapters):
rows of two adapters share a forward pass, each row gets exactly its own adapter at that
adapter's own version, and a version of one adapter lands between decoding steps without
touching the other's rows. Real tiny model; the adapters arrive through the weight target a
syncer writes into."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
import torch

from astraflow.consumers.rollout.engines.adapters import adapter_views
from astraflow.consumers.rollout.engines.base import EngineError, GenRequest
from astraflow.consumers.rollout.engines.hf import HFEngine
from astraflow.core.errors import WeightIntegrityError
from astraflow.core.records import AdapterSpec
from astraflow.models.tiny import build_model, build_tokenizer
from astraflow.weights.adapter import PristineBase, merge_lora

MODULES = ("q_proj", "v_proj")
SPEC = AdapterSpec(r=4, alpha=8.0, target_modules=list(MODULES), base_model="tiny")


@pytest.fixture(scope="module")
def base() -> tuple[Any, Any]:
    tok = build_tokenizer("arith")
    return build_model(tok, seed=3), tok


def lora(model: Any, seed: int) -> dict[str, torch.Tensor]:
    """A LoRA adapter of ``model`` (peft's tensor names) with B far from zero."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(model.config.num_hidden_layers):
        for m in MODULES:
            w = model.get_submodule(f"model.layers.{layer}.self_attn.{m}").weight
            name = f"base_model.model.model.layers.{layer}.self_attn.{m}"
            out[f"{name}.lora_A.weight"] = torch.randn(SPEC.r, w.shape[1], generator=g) * 0.3
            out[f"{name}.lora_B.weight"] = torch.randn(w.shape[0], SPEC.r, generator=g) * 0.3
    return out


def publish(view: Any, tensors: dict[str, torch.Tensor], version: int) -> None:
    """What a syncer does with an adapter version: apply its tensors to the view's target,
    then commit, at a step boundary of the engine."""
    target = view.weight_target()

    def apply() -> None:
        for name, t in tensors.items():
            bits = t.contiguous().view(torch.int32).numpy().reshape(-1)
            target.apply(name, "float32", tuple(t.shape), bits)
        target.set_adapter(SPEC)
        target.finish_version(version)

    view.update_weights(apply)


def merged(model: Any, tensors: dict[str, torch.Tensor] | None) -> Any:
    ref = copy.deepcopy(model)
    if tensors is not None:
        merge_lora(ref, SPEC, tensors, PristineBase())
    return ref.eval()


def logprobs(model: Any, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Each generated token's logprob under ``model`` (teacher-forced)."""
    return decoded(lambda _: model, prompt, generated, [0] * len(generated))


def decoded(model_of: Any, prompt: list[int], generated: list[int], versions: list[int]
            ) -> torch.Tensor:
    """Each generated token's logprob as the engine computes it: token i from a forward of
    the model of ``versions[i]`` on the KV cache the earlier forwards left (a version that
    lands mid-generation leaves the cache of the tokens before it as it was)."""
    out, cache = [], None
    feed = prompt
    with torch.no_grad():
        for tok, v in zip(generated, versions, strict=True):
            res = model_of(v)(input_ids=torch.tensor([feed]), use_cache=True,
                              **({} if cache is None else {"cache": cache}))
            cache = res.get("cache") if "cache" in res else res.get("past_key_values")
            out.append(torch.log_softmax(res.logits[0, -1].float(), -1)[tok])
            feed = [tok]
    return torch.stack(out)


def test_rows_of_two_adapters_share_a_batch_each_with_its_own_adapter_and_version(
        base: tuple[Any, Any]) -> None:
    model, tok = base
    engine = HFEngine(model=copy.deepcopy(model), tokenizer=tok, adapters=["solver", "verifier"],
                      max_batch_size=8, seed=0)
    views = adapter_views(engine, ["solver", "verifier"])
    solver3, solver4, verifier7 = lora(model, 1), lora(model, 2), lora(model, 3)
    publish(views["solver"], solver3, 3)
    publish(views["verifier"], verifier7, 7)
    assert (views["solver"].version, views["verifier"].version) == (3, 7)

    # solver's version 4 lands between two decoding steps of the same mixed batch
    def at_step(step: int) -> None:
        if step != 2:
            return
        t = threading.Thread(target=publish, args=(views["solver"], solver4, 4))
        t.start()
        while not engine.gate._pending:
            time.sleep(0.001)

    engine.step_hook = at_step
    prompts = [tok("12+7=").input_ids, tok("3+4=").input_ids, tok("40+2=").input_ids]
    reqs = [GenRequest(p, max_new_tokens=6, temperature=0.0) for p in prompts]
    rows = engine.generate([
        GenRequest(**{**_fields(reqs[0]), "adapter": "solver"}),
        GenRequest(**{**_fields(reqs[1]), "adapter": "verifier"}),
        GenRequest(**{**_fields(reqs[2]), "adapter": "solver"})])
    engine.step_hook = None
    assert engine.steps >= 3 and all(len(r.token_ids) == 6 for r in rows), rows
    assert rows[0].versions == rows[2].versions == [3, 3, 4, 4, 4, 4]
    assert rows[1].versions == [7] * 6  # the other adapter's rows: untouched by solver's v4
    adapters_of = {3: solver3, 4: solver4, 7: verifier7}
    refs = {v: merged(model, t) for v, t in adapters_of.items()}
    plain = merged(model, None)
    for prompt, row in zip(prompts, rows, strict=True):
        got = torch.tensor(row.logprobs)
        want = decoded(refs.__getitem__, prompt, row.token_ids, row.versions)
        assert torch.allclose(got, want, atol=1e-4), (got, want)
        # and not another adapter's, nor the base's: the check can tell them apart
        for other in [*(refs[v] for v in adapters_of if v not in row.versions), plain]:
            assert (logprobs(other, prompt, row.token_ids) - got).abs().max() > 1e-2
    # the base weights were never changed: the engine's model without routing is the base
    engine.adapters.route([])
    for name, p in model.named_parameters():
        assert torch.equal(p, dict(engine.model.named_parameters())[_routed(name)]), name


def _fields(r: GenRequest) -> dict[str, Any]:
    return {f: getattr(r, f) for f in r.__dataclass_fields__}


def _routed(name: str) -> str:
    """A parameter's name in the engine's model, where targeted layers are wrapped."""
    for m in MODULES:
        name = name.replace(f".{m}.", f".{m}.base.")
    return name


def test_a_view_serves_its_own_adapter_and_a_fresh_slot_is_the_base(
        base: tuple[Any, Any]) -> None:
    model, tok = base
    engine = HFEngine(model=copy.deepcopy(model), tokenizer=tok, adapters=["a", "b"],
                      max_batch_size=4, seed=0)
    views = adapter_views(engine, ["a", "b"])
    tensors = lora(model, 9)
    publish(views["a"], tensors, 5)
    prompt = tok("5+5=").input_ids
    req = GenRequest(prompt, max_new_tokens=4, temperature=0.0)
    (ra,) = views["a"].generate([req])
    (rb,) = views["b"].generate([req])
    assert ra.versions == [5] * 4 and rb.versions == [0] * 4
    assert torch.allclose(torch.tensor(ra.logprobs),
                          logprobs(merged(model, tensors), prompt, ra.token_ids), atol=1e-4)
    assert torch.allclose(torch.tensor(rb.logprobs),
                          logprobs(merged(model, None), prompt, rb.token_ids), atol=1e-4)
    with pytest.raises(EngineError, match="adapter 'c'"):
        engine.generate([GenRequest(prompt, adapter="c")])
    views["a"].close()
    views["b"].close()


def test_a_full_model_version_for_an_adapter_slot_is_refused(base: tuple[Any, Any]) -> None:
    model, tok = base
    engine = HFEngine(model=copy.deepcopy(model), tokenizer=tok, adapters=["a"])
    (view,) = adapter_views(engine, ["a"]).values()
    t = view.weight_target()
    w = torch.zeros(4, dtype=torch.float32)
    with pytest.raises(WeightIntegrityError, match="give its trainer trainer.lora"):
        t.apply("model.norm.weight", "float32", (4,), w.view(torch.int32).numpy())


def test_continuous_or_process_engines_refuse_adapters(base: tuple[Any, Any]) -> None:
    model, tok = base
    with pytest.raises(EngineError, match="continuous: false"):
        HFEngine(model=copy.deepcopy(model), tokenizer=tok, adapters=["a"], continuous=True)


def test_a_workers_runtime_batches_both_adapters_requests_together(
        base: tuple[Any, Any]) -> None:
    """The runtime gives the views of one engine one batcher: concurrent requests of both
    policies go to the engine in one batch (one forward per step for both)."""
    import asyncio

    from astraflow.consumers.rollout.runtime import Runtime

    model, tok = base
    engine = HFEngine(model=copy.deepcopy(model), tokenizer=tok, adapters=["a", "b"],
                      max_batch_size=8, seed=0)
    views = adapter_views(engine, ["a", "b"])
    publish(views["a"], lora(model, 4), 2)
    seen: list[list[str]] = []
    inner = engine.generate

    def spy(requests: Any) -> Any:
        seen.append([r.adapter for r in requests])
        return inner(requests)

    engine.generate = spy  # type: ignore[method-assign]

    async def go() -> list[Any]:
        rt = Runtime.create(views)
        assert rt.batcher("a").shared is rt.batcher("b").shared
        req = GenRequest(tok("1+1=").input_ids, max_new_tokens=3, temperature=0.0)
        try:
            return await asyncio.gather(*(rt.batcher(p).generate(req)
                                          for p in ("a", "b", "a", "b")))
        finally:
            await rt.close()

    results = asyncio.run(go())
    assert sorted(x for batch in seen for x in batch) == ["a", "a", "b", "b"]
    assert len(seen) == 1, seen  # one engine batch for both policies
    assert [r.versions[0] for r in results] == [2, 0, 2, 0]


def test_the_config_refuses_adapters_it_cannot_serve() -> None:
    """rollout.engine.adapters: policies of the run, trained as LoRA adapters of one base,
    on the in-process static hf engine; each problem named at the key."""
    from pathlib import Path

    from astraflow.config import load_experiment
    from astraflow.core.errors import ConfigError

    team = Path(__file__).resolve().parents[3] / "examples" / "smollm2_team.yaml"
    cfg = load_experiment(team)
    assert cfg.rollout.engine.adapters == ["solver", "verifier"]
    for sets, says in [
        (["trainers.verifier.lora=null"], "verifier would be served as LoRA adapters"),
        (["models.verifier.path=other-model"], "share one base model"),
        (["rollout.engine.adapters=[solver, critic]"], "unknown policy 'critic'"),
        (["rollout.engine.continuous=true"], "continuous: false"),
    ]:
        with pytest.raises(ConfigError, match=says):
            load_experiment(team, sets)
