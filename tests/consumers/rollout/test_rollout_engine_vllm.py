"""The vllm engine.

CPU: the engine runs against a fake ``vllm`` module (an ``LLM`` whose ``collective_rpc`` calls
the real worker extension mixed into fake workers): sampling parameters, finish reasons, weight
updates (chunked RPCs, exact bytes, prefix-cache reset after the tensors), quantized models,
close. GPU (marked ``gpu``): the real vLLM on a tiny model built in code.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rollout_helpers import processed_logprobs

from astraflow.consumers.rollout.engines import EngineError, GenRequest, build_engine
from astraflow.consumers.rollout.engines.vllm import VLLMEngine, chunk
from astraflow.consumers.rollout.engines.vllm_ext import WeightLoader, WeightLoadError

# ---------------------------------------------------------------- a fake vLLM (CPU tests)


class FakeModel:
    def __init__(self, events: list[Any], rank: int) -> None:
        self.events = events
        self.rank = rank
        self.loaded: dict[str, Any] = {}

    def load_weights(self, weights: Any) -> set[str]:
        weights = list(weights)
        self.events.append(("load", self.rank, [n for n, _ in weights]))
        self.loaded.update(weights)
        return {n for n, _ in weights}


class FakeWorker(WeightLoader):
    """vLLM's worker with the extension mixed in. It has no ``model_runner``: the extension
    must go through ``get_model()``."""

    def __init__(self, events: list[Any], rank: int, quantization: str | None) -> None:
        self.model_config = types.SimpleNamespace(quantization=quantization)
        self.model = FakeModel(events, rank)

    def get_model(self) -> FakeModel:
        return self.model


class FakeLLM:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.events: list[Any] = []
        quantization = kwargs.get("quantization")
        self.model_config = types.SimpleNamespace(quantization=quantization)
        self.workers = [FakeWorker(self.events, r, quantization) for r in range(2)]
        self.rpc_sizes: list[int] = []  # tensor bytes per collective_rpc call
        self.fail_rpc: int | None = None  # this RPC (0-based) raises, as a dead worker would
        self.reset_ok = True
        self.finish = "length"
        self.params: list[Any] = []
        self.shutdowns = 0
        self.lora_requests: list[Any] = []  # per generate call (None: the base model)
        self.removed_loras: list[int] = []
        self.llm_engine = types.SimpleNamespace(
            engine_core=types.SimpleNamespace(shutdown=self._shutdown),
            remove_lora=self.removed_loras.append)

    def _shutdown(self) -> None:
        self.shutdowns += 1

    def get_tokenizer(self) -> str:
        return "tokenizer"

    def generate(self, prompts: list[dict], params: list[Any], use_tqdm: bool,
                 lora_request: Any = None) -> list[Any]:
        self.params.extend(params)
        self.lora_requests.append(lora_request)
        outs = []
        for p in prompts:
            ids = [p["prompt_token_ids"][-1] + 1, 9]
            lps = [{t: types.SimpleNamespace(logprob=-0.5 * (j + 1)), 99: object()}
                   for j, t in enumerate(ids)]
            outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=ids, logprobs=lps, finish_reason=self.finish)]))
        return outs

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        self.rpc_sizes.append(sum(len(data) for *_, data in args[0]))
        if self.fail_rpc == len(self.rpc_sizes) - 1:
            raise RuntimeError("worker died")
        return [getattr(w, method)(*args) for w in self.workers]

    def reset_prefix_cache(self) -> bool:
        self.events.append(("reset", self.reset_ok))
        return self.reset_ok


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM  # type: ignore[attr-defined]
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict  # type: ignore[attr-defined]
    vllm.inputs = inputs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    # vLLM's LoRARequest(lora_name, lora_int_id, lora_path)
    request.LoRARequest = lambda lora_name, lora_int_id, lora_path: types.SimpleNamespace(  # type: ignore[attr-defined]
        lora_name=lora_name, lora_int_id=lora_int_id, lora_path=lora_path)
    lora.request = request  # type: ignore[attr-defined]
    vllm.lora = lora  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", request)


def make(**kwargs: Any) -> tuple[VLLMEngine, FakeLLM]:
    engine = build_engine("vllm", model_path="/m", initial_version=3, **kwargs)
    assert isinstance(engine, VLLMEngine)
    return engine, engine.llm


def publish(engine: VLLMEngine, tensors: dict[str, tuple[str, np.ndarray]], version: int
            ) -> None:
    """What the syncer does: write bits into the target inside update_weights."""
    def fn() -> None:
        for name, (dtype, arr) in tensors.items():
            engine.target.apply(name, dtype, arr.shape, arr.reshape(-1))
        engine.target.finish_version(version)

    engine.update_weights(fn)


def bf16(shape: tuple[int, ...], seed: int) -> tuple[str, np.ndarray]:
    return "bfloat16", np.random.default_rng(seed).integers(0, 2**16, shape, dtype=np.uint16)


# ---------------------------------------------------------------- CPU tests


def test_builds_llm_and_maps_requests(fake_vllm: None) -> None:
    engine, llm = make(dtype="bfloat16", vllm_args={"enforce_eager": True})
    assert llm.kwargs["worker_extension_cls"].endswith("vllm_ext.WeightLoader")
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["enforce_eager"] is True
    (r,) = engine.generate([GenRequest([1, 4], max_new_tokens=5, temperature=0.7, top_p=0.9,
                                       stop=("=",), stop_token_ids=(2,))])
    assert (r.token_ids, r.logprobs, r.versions, r.finish_reason) == (
        [5, 9], [-0.5, -1.0], [3, 3], "length")
    (p,) = llm.params
    assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.stop_token_ids, p.logprobs) == (
        0.7, 0.9, 5, ["="], [2], 0)
    assert p.include_stop_str_in_output is True and p.skip_special_tokens is False


@pytest.mark.parametrize("reason", ["abort", "error", "repetition", None])
def test_failed_finish_reasons_fail_that_request(fake_vllm: None, reason: str | None) -> None:
    engine, llm = make()
    llm.finish = reason  # type: ignore[assignment]
    (res,) = engine.generate([GenRequest([1, 4])])
    assert res.error is not None and f"finish_reason={reason!r}" in res.error
    assert res.token_ids == [] and res.logprobs == []
    llm.finish = "stop"
    (res,) = engine.generate([GenRequest([1, 4])])
    assert res.finish_reason == "stop" and res.error is None


def test_update_loads_exact_bytes_on_every_worker_then_resets_cache(fake_vllm: None) -> None:
    import torch

    engine, llm = make()
    tensors = {"a.weight": bf16((3, 5), 0), "b.bias": bf16((7,), 1),
               "c.weight": ("float32", np.random.default_rng(2).standard_normal((2, 2))
                            .astype(np.float32).view(np.uint32))}
    publish(engine, tensors, 4)
    assert engine.version == 4
    loads = [e for e in llm.events if e[0] == "load"]
    assert {e[1] for e in loads} == {0, 1}  # every worker
    assert llm.events[-1] == ("reset", True)  # the reset comes after all the tensors
    assert [e[0] for e in llm.events].count("reset") == 1
    for w in llm.workers:
        assert sorted(w.model.loaded) == sorted(tensors)
        for name, (dtype, bits) in tensors.items():
            t = w.model.loaded[name]
            assert t.dtype == getattr(torch, dtype) and tuple(t.shape) == bits.shape
            assert t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() == bits.tobytes()
    # a second version sends only what changed, then resets again
    llm.events.clear()
    publish(engine, {"b.bias": bf16((7,), 5)}, 5)
    assert llm.events == [("load", 0, ["b.bias"]), ("load", 1, ["b.bias"]), ("reset", True)]
    assert engine.generate([GenRequest([1])])[0].versions == [5, 5]


def test_update_is_split_into_bounded_rpcs(fake_vllm: None) -> None:
    engine, llm = make(update_chunk_mb=2000 / 2**20)  # 2000 bytes per RPC
    tensors = {f"t{i}": bf16((300,), i) for i in range(5)}  # 600 bytes each
    tensors["z.big"] = bf16((1500,), 9)  # 3000 bytes: alone in its RPC
    publish(engine, tensors, 1)
    assert llm.rpc_sizes == [1800, 1200, 3000]
    assert engine.rpc_calls == 3
    assert sorted(llm.workers[0].model.loaded) == sorted(tensors)
    assert llm.events[-1] == ("reset", True)


def test_chunk_keeps_order_and_bound() -> None:
    assert chunk([("a", 5), ("b", 5), ("c", 1), ("d", 20), ("e", 1)], 10) == [
        ["a", "b"], ["c"], ["d"], ["e"]]
    assert chunk([], 10) == []


def test_refused_cache_reset_raises_and_blocks_generation(fake_vllm: None) -> None:
    engine, llm = make()
    llm.reset_ok = False
    with pytest.raises(EngineError, match="prefix cache"):
        publish(engine, {"a": bf16((4,), 0)}, 1)
    assert engine.version == 3  # not taken
    with pytest.raises(EngineError, match="did not finish"):
        engine.generate([GenRequest([1])])
    llm.reset_ok = True
    llm.events.clear()
    engine.update_weights(lambda: None)  # the follower's retry: nothing new, but reset again
    assert llm.events == [("reset", True)]
    assert engine.version == 1
    assert engine.generate([GenRequest([1])])[0].versions == [1, 1]


def test_failed_rpc_resends_the_tensors_at_the_next_update(fake_vllm: None) -> None:
    engine, llm = make(update_chunk_mb=1000 / 2**20)  # one 600-byte tensor per RPC
    llm.fail_rpc = 1  # "a" lands, "b" does not
    with pytest.raises(RuntimeError, match="worker died"):
        publish(engine, {"a": bf16((300,), 0), "b": bf16((300,), 1)}, 2)
    assert engine.version == 3 and ("reset", True) not in llm.events
    with pytest.raises(EngineError, match="did not finish"):
        engine.generate([GenRequest([1])])
    llm.events.clear()
    engine.update_weights(lambda: None)  # the follower's retry
    assert llm.events == [("load", 0, ["b"]), ("load", 1, ["b"]), ("reset", True)]
    assert engine.version == 2


def test_quantized_model_refuses_updates(fake_vllm: None) -> None:
    engine, llm = make(vllm_args={"quantization": "fp8"})
    called = []
    with pytest.raises(EngineError, match="quantization='fp8'"):
        engine.update_weights(lambda: called.append(1))
    assert called == [] and llm.events == []  # the syncer never applied the version
    with pytest.raises(WeightLoadError, match="quantized"):  # the worker refuses on its own
        llm.workers[0].af_load_weights([("a", "bfloat16", [1], b"\0\0")])


def test_close_shuts_the_engine_core_down(fake_vllm: None) -> None:
    engine, llm = make()
    engine.close()
    engine.close()
    assert llm.shutdowns == 1
    with pytest.raises(EngineError, match="closed"):
        engine.generate([GenRequest([1])])


def test_published_weights_reach_every_worker_bit_exact(fake_vllm: None, arith_dir: Path,
                                                        tmp_path: Path) -> None:
    """Publisher -> syncer -> engine -> worker extension, as the gpu test below runs it."""
    import torch

    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.core.bus import connect
    from astraflow.models.tiny import build_model, build_tokenizer
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore
    from astraflow.weights.syncer import Syncer

    engine, llm = make(update_chunk_mb=0.25)
    new = build_model(build_tokenizer("arith"), seed=1)
    bus = connect(f"embedded://{tmp_path}/bus.db")
    store = FileStore(tmp_path / "weights")
    pub = Publisher(bus, run="v", policy="default", store=store)
    pub.publish(new.state_dict(), 1)
    pub.flush()
    follower = WeightFollower(Syncer(bus, run="v", policy="default", store=store,
                                     target=engine.weight_target()), engine=engine)
    try:
        assert follower.sync_now(timeout=10) == 1
    finally:
        follower.close()
        pub.close()
        bus.close()
    assert engine.version == 1 and llm.events[-1] == ("reset", True)
    assert len(llm.rpc_sizes) > 1 and max(llm.rpc_sizes) <= 0.25 * 2**20
    expected = {n: t.to(torch.bfloat16) for n, t in new.state_dict().items()}
    for w in llm.workers:
        assert sorted(w.model.loaded) == sorted(expected)
        for n, t in expected.items():
            assert torch.equal(w.model.loaded[n], t), n


def test_update_chunk_mb_comes_from_config(fake_vllm: None, tmp_path: Path) -> None:
    from astraflow.consumers.rollout.config import RolloutConfig
    from astraflow.consumers.rollout.service import build_engines

    rc = RolloutConfig.model_validate(
        {"engine": {"type": "vllm", "model": str(tmp_path), "update_chunk_mb": 64}})
    (engine,) = build_engines(rc, policies=["default"], models={}, out=tmp_path).values()
    assert isinstance(engine, VLLMEngine) and engine.update_chunk_bytes == 64 * 2**20
    with pytest.raises(EngineError, match="update_chunk_mb"):
        build_engine("vllm", model_path=tmp_path, update_chunk_mb=0)


def test_lora_versions_are_served_as_new_lora_requests(fake_vllm: None, tmp_path: Path
                                                        ) -> None:
    """A LoRA trainer's versions: each becomes a peft adapter folder (safetensors with the
    published bits + adapter_config.json) and a LoRARequest with a new name and id; the old one
    is removed; no tensor goes to the workers."""
    import json

    import torch
    from safetensors.torch import load_file

    from astraflow.core.records import AdapterSpec

    spec = AdapterSpec(r=2, alpha=4.0, target_modules=["q_proj"], base_model="/m")
    names = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
             "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    engine, llm = make(vllm_args={"enable_lora": True, "max_lora_rank": 8},
                       adapter_dir=tmp_path / "adapters")
    target = engine.weight_target()
    folders = []
    for version in (4, 5):
        bits = {n: bf16((2, 8) if "lora_A" in n else (8, 2), version + i)
                for i, n in enumerate(names)}

        def fn(bits: dict = bits, version: int = version) -> None:
            for name, (dtype, arr) in bits.items():
                target.apply(name, dtype, arr.shape, arr.reshape(-1))
            target.set_adapter(spec)
            target.finish_version(version)

        engine.update_weights(fn)
        req = engine.lora_request
        assert (req.lora_name, req.lora_int_id) == (f"af-v{version}", version + 1)
        folder = Path(req.lora_path)
        folders.append(folder)
        cfg = json.loads((folder / "adapter_config.json").read_text())
        assert (cfg["r"], cfg["lora_alpha"], cfg["target_modules"]) == (2, 4.0, ["q_proj"])
        saved = load_file(str(folder / "adapter_model.safetensors"))
        for n, (_d, arr) in bits.items():
            assert saved[n].dtype == torch.bfloat16
            assert np.array_equal(saved[n].view(torch.int16).numpy().view(np.uint16), arr), n
        engine.generate([GenRequest([1, 2], max_new_tokens=2)])
        assert llm.lora_requests[-1] is req
        assert engine.version == version
    assert llm.removed_loras == [5] and not folders[0].exists() and folders[1].exists()
    assert llm.rpc_sizes == []  # the adapter never goes through the full-weight route
    engine.close()


def test_lora_versions_need_enable_lora(fake_vllm: None) -> None:
    from astraflow.core.records import AdapterSpec

    engine, _ = make()
    target = engine.weight_target()

    def fn() -> None:
        target.apply("base_model.model.q.lora_A.weight", "bfloat16", (2, 4),
                     bf16((2, 4), 0)[1].reshape(-1))
        target.apply("base_model.model.q.lora_B.weight", "bfloat16", (4, 2),
                     bf16((4, 2), 1)[1].reshape(-1))
        target.set_adapter(AdapterSpec(r=2, alpha=2.0, target_modules=["q"], base_model="m"))
        target.finish_version(1)

    with pytest.raises(EngineError, match="enable_lora"):
        engine.update_weights(fn)


# ---------------------------------------------------------------- GPU: the real vLLM

TEMP, TOP_P = 0.8, 0.9


@pytest.fixture(scope="module")
def vllm_engine(arith_dir: Path):  # noqa: ANN201
    pytest.importorskip("vllm", reason="vLLM is not installed")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    engine = build_engine("vllm", model_path=arith_dir, dtype="float32",
                          gpu_memory_utilization=0.2,
                          vllm_args={"enforce_eager": True, "enable_prefix_caching": True})
    yield engine
    engine.close()


def long_prompt(tok: Any) -> list[int]:
    """41 tokens: two full KV blocks (16 tokens each) that the prefix cache keeps."""
    return tok("12+34=46" * 5)["input_ids"]


@pytest.mark.gpu
def test_vllm_logprobs_match_teacher_forcing(vllm_engine: VLLMEngine, arith_dir: Path) -> None:
    from astraflow.models.tiny import load

    model, tok = load(arith_dir)
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "40+2=")] + [long_prompt(tok)]
    results = vllm_engine.generate([GenRequest(p, max_new_tokens=4, temperature=TEMP,
                                               top_p=TOP_P) for p in prompts])
    for p, r in zip(prompts, results, strict=True):
        assert r.token_ids and len(r.logprobs) == len(r.token_ids)
        assert r.versions == [0] * len(r.token_ids)
        ref = processed_logprobs(model, p, r.token_ids, temperature=TEMP, top_p=TOP_P)
        assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 1e-2


@pytest.mark.gpu
def test_vllm_stop_strings_are_kept(vllm_engine: VLLMEngine, arith_dir: Path) -> None:
    from astraflow.models.tiny import load

    _, tok = load(arith_dir)
    stops = tuple("0123456789+-*=")  # every ordinary token is a stop string
    (r,) = vllm_engine.generate([GenRequest(tok("1+2")["input_ids"], max_new_tokens=8,
                                            temperature=1.0, stop=stops)])
    text = tok.decode(r.token_ids, skip_special_tokens=True)
    if text:  # the first ordinary token stops; special tokens before it (e.g. <pad>) may not
        assert r.finish_reason == "stop" and text[-1] in stops
        assert not any(s in tok.decode(r.token_ids[:-1], skip_special_tokens=True)
                       for s in stops)


@pytest.mark.gpu
def test_vllm_takes_new_weights_in_place(vllm_engine: VLLMEngine, arith_dir: Path,
                                         tmp_path: Path) -> None:
    """An update lands in place, and the next generation of an already-cached prompt runs on
    the new weights (the prefix cache was reset), with the new version on its tokens."""
    import torch

    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.core.bus import connect
    from astraflow.models.tiny import build_model, load
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore
    from astraflow.weights.syncer import Syncer

    _, tok = load(arith_dir)
    prompt = long_prompt(tok)
    vllm_engine.generate([GenRequest(prompt, max_new_tokens=4)])  # fills the prefix cache
    new = build_model(tok, seed=1)  # different weights, same architecture
    bus = connect(f"embedded://{tmp_path}/bus.db")
    store = FileStore(tmp_path / "weights")
    pub = Publisher(bus, run="v", policy="default", store=store)
    pub.publish(new.state_dict(), 1)  # published as bf16
    pub.flush()
    follower = WeightFollower(Syncer(bus, run="v", policy="default", store=store,
                                     target=vllm_engine.weight_target()), engine=vllm_engine)
    try:
        assert follower.sync_now(timeout=10) == 1
        assert vllm_engine.version == 1
        (r,) = vllm_engine.generate([GenRequest(prompt, max_new_tokens=4, temperature=TEMP,
                                                top_p=TOP_P)])
    finally:
        follower.close()
        pub.close()
        bus.close()
    assert r.versions == [1] * len(r.token_ids)
    ref_model = new.to(torch.bfloat16).float()  # what the engine holds: bf16-rounded weights
    ref = processed_logprobs(ref_model, prompt, r.token_ids, temperature=TEMP, top_p=TOP_P)
    assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 1e-2


@pytest.mark.gpu
def test_vllm_serves_published_lora_adapters(arith_dir: Path, tmp_path: Path) -> None:
    """A LoRA trainer's versions through publisher -> syncer -> the real vLLM with LoRA
    enabled: tokens carry the adapter's version and their logprobs are those of the base with
    the (bf16) adapter merged, for two versions in turn (a new LoRARequest each)."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    peft = pytest.importorskip("peft")
    import copy

    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.core.bus import connect
    from astraflow.core.records import AdapterSpec
    from astraflow.models.tiny import load
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore
    from astraflow.weights.syncer import Syncer

    base, tok = load(arith_dir)
    lora_model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    engine = build_engine("vllm", model_path=arith_dir, dtype="float32",
                          gpu_memory_utilization=0.2, adapter_dir=tmp_path / "adapters",
                          vllm_args={"enforce_eager": True, "enable_lora": True,
                                     "max_lora_rank": 8, "max_loras": 2})
    bus = connect(f"embedded://{tmp_path}/bus.db")
    store = FileStore(tmp_path / "weights")
    pub = Publisher(bus, run="v", policy="default", store=store)
    pub.adapter = AdapterSpec(r=8, alpha=16.0, target_modules=["q_proj", "v_proj"],
                              base_model=str(arith_dir))
    follower = WeightFollower(Syncer(bus, run="v", policy="default", store=store,
                                     target=engine.weight_target()), engine=engine)
    prompt = tok("12+34=")["input_ids"]
    try:
        for version in (1, 2):
            if version == 2:  # another adapter: B·A negated
                with torch.no_grad():
                    for n, p in lora_model.named_parameters():
                        if ".lora_B." in n:
                            p.neg_()
            published = peft.get_peft_model_state_dict(lora_model)
            pub.publish(published, version)
            pub.flush()
            assert follower.sync_now(timeout=30) == version
            assert engine.lora_request.lora_name == f"af-v{version}"
            (r,) = engine.generate([GenRequest(prompt, max_new_tokens=4, temperature=TEMP,
                                               top_p=TOP_P)])
            assert r.versions == [version] * len(r.token_ids)
            ref_model = copy.deepcopy(lora_model)
            peft.set_peft_model_state_dict(
                ref_model, {k: v.to(torch.bfloat16).float() for k, v in published.items()})
            ref = processed_logprobs(ref_model.merge_and_unload(), prompt, r.token_ids,
                                     temperature=TEMP, top_p=TOP_P)
            assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 2e-2
    finally:
        follower.close()
        pub.close()
        bus.close()
        engine.close()
