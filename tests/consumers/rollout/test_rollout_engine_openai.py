"""The openai engine against a small OpenAI-compatible server written here (stdlib http.server)
and backed by the hf engine: the real client code, the real wire format, and the weight-loading
routes of SGLang (``/update_weights_from_disk``) and vLLM's development mode (``/collective_rpc``
``reload_weights``, ``/reset_prefix_cache``, ``/update_weight_version``), with the request and
response shapes of vLLM 0.33.0 and SGLang 0.5.23. Every request the server gets is recorded, so
the tests assert the bodies and their order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rollout_helpers import processed_logprobs
from waiting import wait_for

from astraflow.consumers.rollout.engines import EngineError, GenRequest, build_engine
from astraflow.consumers.rollout.engines.hf import HFEngine
from astraflow.consumers.rollout.engines.openai import NEUTRAL_SAMPLING, OpenAIEngine
from astraflow.core.bus import Bus
from astraflow.core.ports import free_port
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore

VLLM_ADMIN = ["/collective_rpc", "/reset_prefix_cache", "/update_weight_version"]


class Server(ThreadingHTTPServer):
    """``kind``: ``vllm`` or ``sglang`` (what ``/v1/models`` says, which routes exist)."""

    daemon_threads = True

    def __init__(self, engine: HFEngine, kind: str, *, token_ids_field: bool = True,
                 logprobs_mode: str | None = "processed_logprobs") -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.engine = engine
        self.kind = kind
        self.token_ids_field = token_ids_field
        self.logprobs_mode = logprobs_mode  # vLLM; None: not in dev mode (no /server_info)
        self.log: list[tuple[str, Any]] = []  # (path, body) of every request, in order
        self.finish_reason: str | None = None  # forced finish reason of completions
        self.reset_ok = True
        self.hold: threading.Event | None = None  # completions wait on it when set
        self.entered = threading.Event()  # a completion request has arrived
        self._log_lock = threading.Lock()
        self.adapters: set[str] = set()  # LoRA adapters loaded (the dynamic LoRA routes)
        self._pristine: Any = None  # the base weights the served adapter is merged onto

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def paths(self) -> list[str]:
        with self._log_lock:
            return [p for p, _ in self.log]

    def bodies(self, path: str) -> list[Any]:
        with self._log_lock:
            return [b for p, b in self.log if p == path]

    def record(self, path: str, body: Any) -> None:
        with self._log_lock:
            self.log.append((path, body))

    def load(self, directory: str) -> None:
        from safetensors.torch import load_file

        state = load_file(str(Path(directory) / "model.safetensors"))
        with torch.no_grad():
            for name, t in self.engine.model.state_dict().items():
                if name in state:
                    t.copy_(state[name].to(t.dtype))


    def load_lora(self, name: str, directory: str) -> None:
        """What the servers do with an adapter folder, here by merging it into the backend
        (this fake serves one adapter at a time: the one loaded last)."""
        from safetensors.torch import load_file

        from astraflow.core.records import AdapterSpec
        from astraflow.weights.adapter import PristineBase, merge_lora

        cfg = json.loads((Path(directory) / "adapter_config.json").read_text())
        spec = AdapterSpec(r=cfg["r"], alpha=cfg["lora_alpha"],
                           target_modules=cfg["target_modules"],
                           base_model=cfg["base_model_name_or_path"])
        self._pristine = self._pristine or PristineBase()
        merge_lora(self.engine.model, spec,
                   load_file(str(Path(directory) / "adapter_model.safetensors")), self._pristine)
        self.adapters.add(name)


LORA_ROUTES = {"vllm": ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"),
               "sglang": ("/load_lora_adapter", "/unload_lora_adapter")}


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        plain = isinstance(body, str)  # vLLM's LoRA routes answer plain text
        data = body.encode() if plain else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if plain else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        srv = self.server
        srv.record(self.path, None)
        if self.path == "/v1/models":
            return self._reply(200, {"object": "list", "data": [
                {"id": "/models/x", "object": "model", "owned_by": srv.kind, "root": "/models/x"}]})
        if self.path == "/server_info?config_format=json" and srv.kind == "vllm" and (
                srv.logprobs_mode is not None):
            return self._reply(200, {"vllm_config": {"model_config": {
                "logprobs_mode": srv.logprobs_mode, "generation_config": "auto"}}})
        return self._reply(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        srv.record(self.path, body)
        if srv.kind == "sglang" and self.path == "/update_weights_from_disk":
            srv.load(body["model_path"])
            return self._reply(200, {"success": True, "message": "ok", "num_paused_requests": 0})
        load, unload = LORA_ROUTES[srv.kind]
        if self.path == load:
            srv.load_lora(body["lora_name"], body["lora_path"])
            # vLLM's api_server: Response(content="Success: LoRA adapter '<name>' added ...")
            return self._reply(200, {"success": True, "error_message": None} if srv.kind ==
                               "sglang" else f"Success: LoRA adapter '{body['lora_name']}' "
                                             "added successfully.")
        if self.path == unload:
            if body["lora_name"] not in srv.adapters:
                return self._reply(404, {"detail": f"no adapter {body['lora_name']}"})
            srv.adapters.discard(body["lora_name"])
            return self._reply(200, {"success": True, "error_message": None} if srv.kind ==
                               "sglang" else f"Success: LoRA adapter '{body['lora_name']}' "
                                             "removed successfully.")
        if "model" in body and self.path == "/v1/completions" and srv.adapters and (
                body["model"] not in srv.adapters):
            return self._reply(404, {"detail": f"model {body['model']} does not exist"})
        if srv.kind == "vllm" and srv.logprobs_mode is not None:  # dev mode: the dev routes
            if self.path == "/collective_rpc":
                assert body["method"] == "reload_weights"
                srv.load(body["kwargs"]["weights_path"])
                return self._reply(200, {"results": [None]})
            if self.path == "/reset_prefix_cache":
                return self._reply(200, {"success": srv.reset_ok})
            if self.path == "/update_weight_version":
                return self._reply(200, {"success": True, "new_version": body["new_version"]})
        if self.path != "/v1/completions":
            return self._reply(404, {"detail": "Not Found"})
        return self._complete(body)

    def _complete(self, body: dict[str, Any]) -> None:
        srv = self.server
        srv.entered.set()
        if srv.hold is not None:
            assert srv.hold.wait(30)
        if not isinstance(body.get("prompt"), list) or body.get("logprobs") is None:
            return self._reply(400, {"error": "token-id prompt and logprobs required"})
        (res,) = srv.engine.generate([GenRequest(
            body["prompt"], max_new_tokens=body["max_tokens"], temperature=body["temperature"],
            top_p=body["top_p"], stop=tuple(body.get("stop") or ()),
            stop_token_ids=tuple(body.get("stop_token_ids") or ()))])
        tok = srv.engine.tokenizer
        choice: dict[str, Any] = {
            "index": 0, "text": tok.decode(res.token_ids, skip_special_tokens=False),
            "finish_reason": srv.finish_reason or res.finish_reason,
            "logprobs": {"tokens": [f"token_id:{t}" for t in res.token_ids],
                         "token_logprobs": res.logprobs, "top_logprobs": None,
                         "text_offset": []}}
        if srv.token_ids_field:
            choice["token_ids"] = res.token_ids
        self._reply(200, {"id": "cmpl-1", "object": "text_completion",
                          "model": body.get("model", "/models/x"), "choices": [choice]})


@pytest.fixture
def server_factory(arith_dir: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(kind: str = "vllm", **kwargs: Any) -> Server:
        backend = build_engine("hf", model_path=arith_dir, threads=1, seed=5)
        srv = Server(backend, kind, **kwargs)  # type: ignore[arg-type]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        if srv.hold is not None:
            srv.hold.set()
        srv.shutdown()
        srv.server_close()


def client_for(srv: Server, arith_dir: Path, **kwargs: Any) -> OpenAIEngine:
    engine = build_engine("openai", model_path=arith_dir, base_url=srv.url, **kwargs)
    assert isinstance(engine, OpenAIEngine)
    return engine


# -- generation ------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "token_ids_field"),
                         [("vllm", True), ("vllm", False), ("sglang", True)],
                         ids=["vllm-token_ids", "vllm-token_id-strings", "sglang"])
def test_tokens_and_logprobs_come_from_the_server(server_factory: Callable[..., Server],
                                                  arith_dir: Path, kind: str,
                                                  token_ids_field: bool) -> None:
    server = server_factory(kind, token_ids_field=token_ids_field)
    client = client_for(server, arith_dir)
    tok = client.tokenizer
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "40+2=", "7*7=")]
    results = client.generate([GenRequest(p, max_new_tokens=5, temperature=0.8)
                               for p in prompts])
    model = server.engine.model
    for p, r in zip(prompts, results, strict=True):
        assert 1 <= len(r.token_ids) <= 5 and r.versions == [0] * len(r.token_ids)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([p + r.token_ids])).logits[0]
        ref = [torch.log_softmax(logits[len(p) - 1 + j] / 0.8, -1)[t].item()
               for j, t in enumerate(r.token_ids)]
        assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 1e-4


def test_vllm_request_body(server_factory: Callable[..., Server], arith_dir: Path) -> None:
    """Neutral sampling fields sent explicitly (vLLM would fill them from
    generation_config.json), no `model` unless configured, stop strings kept, no SGLang
    fields."""
    server = server_factory("vllm")
    client = client_for(server, arith_dir)
    client.generate([GenRequest([1, 4, 13], max_new_tokens=3, temperature=0.7, top_p=0.9,
                                stop=("=",), stop_token_ids=(2,))])
    (body,) = server.bodies("/v1/completions")
    assert body == {"prompt": [1, 4, 13], "max_tokens": 3, "temperature": 0.7, "top_p": 0.9,
                    "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                    "presence_penalty": 0.0, "frequency_penalty": 0.0, "logprobs": 1,
                    "skip_special_tokens": False, "return_token_ids": True,
                    "include_stop_str_in_output": True, "return_tokens_as_token_ids": True,
                    "stop": ["="], "stop_token_ids": [2]}
    # the server was asked what it is once, before the first request
    assert server.paths() == ["/v1/models", "/server_info?config_format=json",
                              "/v1/completions"]


def test_sglang_request_body_keeps_stops(server_factory: Callable[..., Server],
                                         arith_dir: Path) -> None:
    server = server_factory("sglang")
    client = client_for(server, arith_dir, served_model="my-model")
    client.generate([GenRequest([1, 4, 13], max_new_tokens=2, stop=("=",))])
    (body,) = server.bodies("/v1/completions")
    assert body["no_stop_trim"] is True
    assert body["model"] == "my-model"
    assert {k: body[k] for k in NEUTRAL_SAMPLING} == NEUTRAL_SAMPLING
    assert "include_stop_str_in_output" not in body and "return_tokens_as_token_ids" not in body
    assert server.paths() == ["/v1/models", "/v1/completions"]  # no /server_info for SGLang


@pytest.mark.parametrize("reason", ["abort", "error", None])
def test_abort_and_error_finishes_fail_the_request(server_factory: Callable[..., Server],
                                                   arith_dir: Path,
                                                   reason: str | None) -> None:
    server = server_factory("sglang")
    server.finish_reason = reason or "content_filter"
    client = client_for(server, arith_dir)
    with pytest.raises(EngineError, match=f"finish_reason={server.finish_reason!r}"):
        client.generate([GenRequest([1, 4], max_new_tokens=2)])


def test_server_errors_are_engine_errors(arith_dir: Path) -> None:
    client = build_engine("openai", model_path=arith_dir, base_url="http://127.0.0.1:9",
                          request_timeout=2)
    with pytest.raises(EngineError, match="127.0.0.1:9"):
        client.generate([GenRequest([1, 4], max_new_tokens=2)])


# -- what the logprobs mean ------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "temperature", "top_p", "ok"), [
    ("processed_logprobs", 0.7, 0.9, True),
    ("raw_logprobs", 1.0, 1.0, True),
    ("raw_logprobs", 0.0, 0.5, True),  # greedy: top-p ignored, unscaled logprobs
    ("raw_logprobs", 0.7, 1.0, False),
    ("raw_logprobs", 1.0, 0.9, False),
    ("processed_logits", 1.0, 1.0, False),
])
def test_vllm_logprobs_mode_is_checked(server_factory: Callable[..., Server], arith_dir: Path,
                                       mode: str, temperature: float, top_p: float,
                                       ok: bool) -> None:
    server = server_factory("vllm", logprobs_mode=mode)
    client = client_for(server, arith_dir)
    request = GenRequest([1, 4], max_new_tokens=2, temperature=temperature, top_p=top_p)
    if ok:
        (r,) = client.generate([request])
        assert r.token_ids
    else:
        with pytest.raises(EngineError, match="--logprobs-mode processed_logprobs"):
            client.generate([request])
        assert server.bodies("/v1/completions") == []  # refused before sampling
        lenient = client_for(server, arith_dir, check_logprobs=False)
        assert lenient.generate([request])[0].token_ids


def test_sglang_refuses_top_p(server_factory: Callable[..., Server], arith_dir: Path) -> None:
    server = server_factory("sglang")
    client = client_for(server, arith_dir)
    with pytest.raises(EngineError, match="top-p renormalisation"):
        client.generate([GenRequest([1, 4], max_new_tokens=2, top_p=0.8)])
    assert client.generate([GenRequest([1, 4], max_new_tokens=2, temperature=0.6)])
    assert client.generate([GenRequest([1, 4], max_new_tokens=2, temperature=0.0, top_p=0.8)])


def test_vllm_without_dev_mode_warns(server_factory: Callable[..., Server], arith_dir: Path,
                                     caplog: pytest.LogCaptureFixture) -> None:
    server = server_factory("vllm", logprobs_mode=None)
    client = client_for(server, arith_dir)
    with caplog.at_level("WARNING", logger="astraflow.rollout.openai"):
        client.generate([GenRequest([1, 4], max_new_tokens=2, temperature=0.7)])
    assert "VLLM_SERVER_DEV_MODE=1" in caplog.text
    assert "--logprobs-mode processed_logprobs" in caplog.text


def test_config_mistakes_are_refused(arith_dir: Path) -> None:
    with pytest.raises(EngineError, match="admin_path"):
        build_engine("openai", model_path=arith_dir, admin="custom")
    with pytest.raises(EngineError, match="server: sglang"):
        build_engine("openai", model_path=arith_dir, admin="sglang", server="vllm")
    with pytest.raises(EngineError, match="valid: none, sglang, vllm, custom"):
        build_engine("openai", model_path=arith_dir, admin="update_weights")


# -- weights ---------------------------------------------------------------------------------
@pytest.mark.parametrize("admin", ["sglang", "vllm"])
def test_admin_loads_each_new_version(server_factory: Callable[..., Server], arith_dir: Path,
                                      bus: Bus, tmp_path: Path, admin: str) -> None:
    """weights.<policy> → host bits → a safetensors checkpoint → the server's load route(s) in
    order; the server then runs on the published (bf16) weights, bit for bit, and tokens carry
    the new version."""
    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.models.tiny import load
    from astraflow.weights.syncer import Syncer

    server = server_factory(admin)
    client = client_for(server, arith_dir, admin=admin, checkpoint_dir=tmp_path / "ckpt")
    store = FileStore(tmp_path / "weights")
    follower = WeightFollower(Syncer(bus, run="o", policy="default", store=store,
                                     target=client.weight_target()), engine=client)
    trainer, _ = load(arith_dir)
    pub = Publisher(bus, run="o", policy="default", store=store)
    for version in (1, 2):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(0.01 * torch.randn_like(p))
        pub.publish(trainer.state_dict(), version)
        pub.flush()
        assert follower.sync_now(timeout=10) == version
        assert client.version == version
        ckpt = str(tmp_path / "ckpt" / f"v{version:010d}")
        if admin == "sglang":
            assert server.bodies("/update_weights_from_disk")[-1] == {
                "model_path": ckpt, "weight_version": str(version)}
        else:
            assert [p for p in server.paths() if p in VLLM_ADMIN] == VLLM_ADMIN * version
            assert server.bodies("/collective_rpc")[-1] == {
                "method": "reload_weights", "kwargs": {"weights_path": ckpt}, "timeout": 1800.0}
            assert server.bodies("/update_weight_version")[-1] == {"new_version": str(version)}
        for name, p in server.engine.model.state_dict().items():
            assert torch.equal(p, trainer.state_dict()[name].to(torch.bfloat16).float()), name
    (r,) = client.generate([GenRequest([1, 4, 13, 5, 16], max_new_tokens=3)])
    assert r.versions == [2] * len(r.token_ids)
    assert len(list((tmp_path / "ckpt").glob("v*"))) <= 2  # old checkpoints are removed
    follower.close()
    pub.close()


@pytest.mark.parametrize("admin", ["vllm", "sglang"])
def test_lora_versions_go_through_the_dynamic_lora_routes(
        server_factory: Callable[..., Server], arith_dir: Path, bus: Bus, tmp_path: Path,
        admin: str) -> None:
    """A LoRA trainer's versions: an adapter folder per version, loaded under a new name
    (vLLM /v1/load_lora_adapter, SGLang /load_lora_adapter), the old one unloaded, requests
    naming the adapter; the server then computes the logits of the base with the adapter
    merged (peft's merge of the published bf16 adapter)."""
    import copy

    from peft import (
        LoraConfig,
        get_peft_model,
        get_peft_model_state_dict,
        set_peft_model_state_dict,
    )

    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.core.records import AdapterSpec
    from astraflow.models.tiny import load
    from astraflow.weights.syncer import Syncer

    server = server_factory(admin)
    client = client_for(server, arith_dir, admin=admin, checkpoint_dir=tmp_path / "ckpt")
    store = FileStore(tmp_path / "weights")
    follower = WeightFollower(Syncer(bus, run="o", policy="default", store=store,
                                     target=client.weight_target()), engine=client)
    base, _ = load(arith_dir)
    peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    pub = Publisher(bus, run="o", policy="default", store=store)
    pub.adapter = AdapterSpec(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"],
                              base_model=str(arith_dir))
    load_route, unload_route = LORA_ROUTES[admin]
    for version in (1, 2):
        with torch.no_grad():
            for n, p in peft_model.named_parameters():
                if ".lora_" in n:
                    p.add_(0.05 * torch.randn_like(p))
        published = get_peft_model_state_dict(peft_model)
        pub.publish(published, version)
        pub.flush()
        assert follower.sync_now(timeout=10) == version
        assert client.version == version and client.lora_name == f"af-v{version}"
        path = str(tmp_path / "ckpt" / f"lora-v{version:010d}")
        assert server.bodies(load_route)[-1] == {"lora_name": f"af-v{version}",
                                                 "lora_path": path}
    assert server.bodies(unload_route) == [{"lora_name": "af-v1"}]
    assert server.adapters == {"af-v2"}
    assert not (tmp_path / "ckpt" / f"lora-v{1:010d}").exists()
    assert not server.bodies("/update_weights_from_disk") + server.bodies("/collective_rpc")
    (r,) = client.generate([GenRequest([1, 4, 13, 5, 16], max_new_tokens=3)])
    assert r.versions == [2] * len(r.token_ids)
    assert server.bodies("/v1/completions")[-1]["model"] == "af-v2"
    # the server's model = the base with the published (bf16) adapter merged, as peft merges
    bf16 = {k: v.to(torch.bfloat16).float() for k, v in published.items()}
    set_peft_model_state_dict(peft_model, bf16)
    merged = peft_model.merge_and_unload().eval()
    ids = torch.tensor([[1, 4, 13, 5, 16, 6]])
    with torch.no_grad():
        want, got = merged(input_ids=ids).logits, server.engine.model(input_ids=ids).logits
        plain = base(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert (want - plain).abs().max() > 1e-3
    follower.close()
    pub.close()


def sync_fn(client: OpenAIEngine, version: int) -> Callable[[], int]:
    """What the syncer does in update_weights: write bits into the host target, commit."""
    def fn() -> int:
        assert client.target is not None
        client.target.apply("unused.weight", "bfloat16", (2,),
                            np.array([version, version], dtype=np.uint16))
        client.target.finish_version(version)
        return version
    return fn


def test_vllm_failed_cache_reset_is_an_error(server_factory: Callable[..., Server],
                                             arith_dir: Path, tmp_path: Path) -> None:
    """A prefix cache that was not reset holds KV of the old weights: the update fails,
    requests fail until a later update succeeds, and that one sends the whole sequence."""
    server = server_factory("vllm")
    server.reset_ok = False
    client = client_for(server, arith_dir, admin="vllm", checkpoint_dir=tmp_path)
    with pytest.raises(EngineError, match="prefix cache"):
        client.update_weights(sync_fn(client, 1))
    assert client.version == 0
    assert "/update_weight_version" not in server.paths()
    with pytest.raises(EngineError, match="weights are unknown"):
        client.generate([GenRequest([1, 4], max_new_tokens=2)])
    server.reset_ok = True
    assert client.update_weights(lambda: 1) == 1  # nothing new from the syncer: retried
    assert client.version == 1
    assert [p for p in server.paths() if p in VLLM_ADMIN] == VLLM_ADMIN[:2] + VLLM_ADMIN
    assert client.generate([GenRequest([1, 4], max_new_tokens=2)])[0].versions[0] == 1


def test_vllm_admin_without_dev_mode_says_so(server_factory: Callable[..., Server],
                                             arith_dir: Path, tmp_path: Path) -> None:
    server = server_factory("vllm", logprobs_mode=None)  # no dev routes
    client = client_for(server, arith_dir, admin="vllm", checkpoint_dir=tmp_path)
    with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
        client.update_weights(sync_fn(client, 1))


@pytest.mark.parametrize("admin", ["sglang", "vllm"])
def test_update_waits_for_requests_in_flight(server_factory: Callable[..., Server],
                                             arith_dir: Path, tmp_path: Path,
                                             admin: str) -> None:
    """An update does not reach the server while a request runs; that request is labelled
    with the version it ran under, and one sent while the update waits runs after it, on the
    new version."""
    server = server_factory(admin)
    server.hold = threading.Event()
    client = client_for(server, arith_dir, admin=admin, checkpoint_dir=tmp_path)
    results: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], Any]) -> threading.Thread:
        t = threading.Thread(target=lambda: results.__setitem__(name, fn()), daemon=True)
        t.start()
        return t

    first = run("first", lambda: client.generate([GenRequest([1, 4], max_new_tokens=2)]))
    assert server.entered.wait(10)
    update = run("update", lambda: client.update_weights(sync_fn(client, 1)))
    wait_for(lambda: client.gate.counts() == (1, 0, 1), 10, every=0.005)
    second = run("second", lambda: client.generate([GenRequest([1, 5], max_new_tokens=2)]))
    wait_for(lambda: client.gate.counts() == (1, 1, 1), 10, every=0.005)
    admin_paths = {"/update_weights_from_disk", *VLLM_ADMIN}
    assert not admin_paths & set(server.paths())  # nothing loaded while `first` runs
    assert len(server.bodies("/v1/completions")) == 1  # `second` waits behind the update
    server.hold.set()
    for t in (first, update, second):
        t.join(30)
        assert not t.is_alive()
    assert results["update"] == 1 and client.version == 1
    assert set(results["first"][0].versions) == {0}
    assert set(results["second"][0].versions) == {1}
    order = [p for p in server.paths() if p == "/v1/completions" or p in admin_paths]
    assert order[0] == "/v1/completions" and order[-1] == "/v1/completions"
    assert order[1:-1] == (["/update_weights_from_disk"] if admin == "sglang" else VLLM_ADMIN)


# -- GPU: a real vLLM server -----------------------------------------------------------------
TEMP, TOP_P = 0.8, 0.9


@pytest.fixture(scope="module")
def vllm_server(arith_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vllm serve`` on the tiny model, in dev mode, with processed logprobs."""
    import os
    import shutil
    import subprocess
    import urllib.request

    pytest.importorskip("vllm", reason="vLLM is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    exe = shutil.which("vllm")
    if exe is None:
        pytest.skip("no `vllm` command on PATH")
    port = free_port()
    logf = (tmp_path_factory.mktemp("vllm") / "server.log").open("w")
    proc = subprocess.Popen(
        [exe, "serve", str(arith_dir), "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.2",
         "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs"],
        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"}, stdout=logf, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, f"vllm serve exited; see {logf.name}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"vllm serve not up in 600 s; see {logf.name}"
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        logf.close()


@pytest.mark.gpu
def test_real_vllm_server(vllm_server: str, arith_dir: Path, tmp_path: Path) -> None:
    """Against ``vllm serve``: the server is found and its logprobs mode read; logprobs equal a
    teacher-forced forward under temperature and top-p; stop strings are kept; after an update
    (the dev-mode sequence) a prompt already in the prefix cache runs on the new weights and
    its tokens carry the new version."""
    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.core.bus import connect
    from astraflow.models.tiny import build_model, load
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.syncer import Syncer

    model, tok = load(arith_dir)
    client = build_engine("openai", model_path=arith_dir, base_url=vllm_server, admin="vllm",
                          checkpoint_dir=tmp_path / "ckpt")
    assert isinstance(client, OpenAIEngine)
    assert (client.info.kind, client.info.logprobs_mode) == ("vllm", "processed_logprobs")
    prompt = tok("12+34=46" * 5)["input_ids"]  # long enough for full, cached KV blocks
    prompts = [tok(t)["input_ids"] for t in ("1+2=", "40+2=")] + [prompt]
    for p, r in zip(prompts, client.generate([GenRequest(p, max_new_tokens=4, temperature=TEMP,
                                                         top_p=TOP_P) for p in prompts]),
                    strict=True):
        assert r.token_ids and r.versions == [0] * len(r.token_ids)
        ref = processed_logprobs(model, p, r.token_ids, temperature=TEMP, top_p=TOP_P)
        assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 1e-2

    stops = tuple("0123456789+-*=")
    (r,) = client.generate([GenRequest(tok("1+2")["input_ids"], max_new_tokens=8, stop=stops)])
    text = tok.decode(r.token_ids, skip_special_tokens=True)
    if text:  # the first ordinary token stops and stays in the output
        assert r.finish_reason == "stop" and text[-1] in stops

    new = build_model(tok, seed=1)
    bus = connect(f"embedded://{tmp_path}/bus.db")
    store = FileStore(tmp_path / "weights")
    pub = Publisher(bus, run="o", policy="default", store=store)
    pub.publish(new.state_dict(), 1)
    pub.flush()
    follower = WeightFollower(Syncer(bus, run="o", policy="default", store=store,
                                     target=client.weight_target()), engine=client)
    try:
        assert follower.sync_now(timeout=10) == 1 and client.version == 1
        (r,) = client.generate([GenRequest(prompt, max_new_tokens=4, temperature=TEMP,
                                           top_p=TOP_P)])
    finally:
        follower.close()
        pub.close()
        bus.close()
    assert r.versions == [1] * len(r.token_ids)
    ref = processed_logprobs(new.to(torch.bfloat16).float(), prompt, r.token_ids,
                             temperature=TEMP, top_p=TOP_P)
    assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < 1e-2
