"""The openai engine against a small OpenAI-compatible /v1/completions server written here
(stdlib http.server) and backed by the hf engine: the real client code, the real wire format
(vLLM's token-id extensions), and SGLang's /update_weights_from_disk for new weights."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from astraflow.consumers.rollout.engines import EngineError, GenRequest, build_engine
from astraflow.consumers.rollout.engines.hf import HFEngine
from astraflow.core.bus import Bus
from astraflow.weights.publisher import Publisher
from astraflow.weights.store import FileStore


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: HFEngine, token_ids_field: bool) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.engine = engine
        self.token_ids_field = token_ids_field
        self.loaded: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/update_weights_from_disk":
            from safetensors.torch import load_file

            state = load_file(str(Path(body["model_path"]) / "model.safetensors"))
            model = self.server.engine.model
            with torch.no_grad():
                for name, t in model.state_dict().items():
                    if name in state:
                        t.copy_(state[name].to(t.dtype))
            self.server.loaded.append(body)
            return self._reply(200, {"success": True, "message": "ok"})
        if self.path != "/v1/completions":
            return self._reply(404, {"error": "no such route"})
        if not isinstance(body.get("prompt"), list) or body.get("logprobs") is None:
            return self._reply(400, {"error": "token-id prompt and logprobs required"})
        (res,) = self.server.engine.generate([GenRequest(
            body["prompt"], max_new_tokens=body["max_tokens"], temperature=body["temperature"],
            top_p=body["top_p"], stop=tuple(body.get("stop") or ()),
            stop_token_ids=tuple(body.get("stop_token_ids") or ()))])
        tok = self.server.engine.tokenizer
        choice: dict[str, Any] = {
            "index": 0, "text": tok.decode(res.token_ids, skip_special_tokens=False),
            "finish_reason": res.finish_reason,
            "logprobs": {"tokens": [f"token_id:{t}" for t in res.token_ids],
                         "token_logprobs": res.logprobs, "top_logprobs": None,
                         "text_offset": []}}
        if self.server.token_ids_field:
            choice["token_ids"] = res.token_ids
        self._reply(200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                          "choices": [choice]})


@pytest.fixture(params=[True, False], ids=["token_ids", "token_id-strings"])
def server(request: pytest.FixtureRequest, arith_dir: Path) -> Iterator[Server]:
    backend = build_engine("hf", model_path=arith_dir, threads=1, seed=5)
    srv = Server(backend, token_ids_field=request.param)  # type: ignore[arg-type]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_tokens_and_logprobs_come_from_the_server(server: Server, arith_dir: Path) -> None:
    client = build_engine("openai", model_path=arith_dir, base_url=server.url)
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


def test_server_errors_are_engine_errors(arith_dir: Path) -> None:
    client = build_engine("openai", model_path=arith_dir, base_url="http://127.0.0.1:9",
                          request_timeout=2)
    with pytest.raises(EngineError, match="127.0.0.1:9"):
        client.generate([GenRequest([1, 4], max_new_tokens=2)])


def test_sglang_admin_loads_each_new_version(server: Server, arith_dir: Path, bus: Bus,
                                             tmp_path: Path) -> None:
    """weights.<policy> → host bits → a safetensors checkpoint → /update_weights_from_disk;
    the server then runs on the published (bf16) weights and tokens carry the new version."""
    from astraflow.consumers.rollout.weights import WeightFollower
    from astraflow.models.tiny import load
    from astraflow.weights.syncer import Syncer

    client = build_engine("openai", model_path=arith_dir, base_url=server.url, admin="sglang",
                          checkpoint_dir=tmp_path / "ckpt")
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
        assert server.loaded[-1]["weight_version"] == str(version)
        for name, p in server.engine.model.state_dict().items():
            assert torch.equal(p, trainer.state_dict()[name].to(torch.bfloat16).float()), name
    (r,) = client.generate([GenRequest([1, 4, 13, 5, 16], max_new_tokens=3)])
    assert r.versions == [2] * len(r.token_ids)
    assert len(list((tmp_path / "ckpt").glob("v*"))) <= 2  # old checkpoints are removed
    follower.close()
    pub.close()
