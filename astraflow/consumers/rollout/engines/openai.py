"""The ``openai`` engine: any OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang).

Requests send the prompt as token ids and ask for the sampled token's logprob; token ids come
back through vLLM's extensions ``return_token_ids`` (``choices[].token_ids``) or
``return_tokens_as_token_ids`` (logprob tokens spelled ``"token_id:<id>"``); a server that gives
neither is refused (text cannot be re-tokenised reliably). Stop strings are kept in the output
(``include_stop_str_in_output``). The server batches (``continuous``): requests go one by one,
up to ``max_batch_size`` in flight.

Behaviour logprobs are whatever the server reports: vLLM reports the raw (temperature 1)
distribution unless started with ``--logprobs-mode processed_logprobs``; start it that way when
sampling at another temperature.

Weights (``admin``): the syncer's bits are kept on the host; each new version is written as a
safetensors checkpoint under ``checkpoint_dir`` (config and tokenizer files copied from the
model directory), then the server is told to load it:

* ``sglang``: ``POST /update_weights_from_disk`` ``{"model_path", "weight_version"}`` (SGLang's
  ``UpdateWeightFromDiskReqInput``; checked against its source, not against a running server);
* ``custom``: ``POST admin_path`` with ``admin_body``, ``{path}``/``{version}`` filled in. For vLLM
  there is no stable upstream load-from-disk endpoint: put one in front of it (e.g. a route that
  calls ``collective_rpc`` on a worker extension, as prime-rl does) and point ``custom`` at it.

Versions per token are the version the server was last told to load when the request was sent
(a request in flight across an update is attributed to the older version).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from astraflow.consumers.rollout.engines.base import ENGINES, EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.engines.target import HostTarget

log = logging.getLogger("astraflow.rollout.openai")

T = TypeVar("T")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class OpenAIEngine:
    """A client of an OpenAI-compatible completion server; see the module docstring."""

    name = "openai"
    continuous = True

    def __init__(self, model_path: str | Path, *, base_url: str = "http://127.0.0.1:8000",
                 served_model: str | None = None, api_key: str | None = None,
                 request_timeout: float = 120.0, max_batch_size: int = 64,
                 admin: str = "none", admin_path: str = "/update_weights",
                 admin_body: dict[str, Any] | None = None,
                 checkpoint_dir: str | Path | None = None, initial_version: int = 0,
                 tokenizer: Any = None, **_: Any) -> None:
        if admin not in ("none", "sglang", "custom"):
            raise EngineError(f"unknown admin {admin!r}; valid: none, sglang, custom")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer = tokenizer
        self.model_path = Path(model_path)
        self.base_url = base_url.rstrip("/")
        self.served_model = served_model or self.model_path.name
        self.api_key = api_key
        self.request_timeout = request_timeout
        self.max_batch_size = max_batch_size
        self.admin = admin
        self.admin_path = admin_path
        self.admin_body = admin_body or {"weight_dir": "{path}"}
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else self.model_path.parent / (
            f"{self.model_path.name}-rollout-weights")
        self._version = initial_version
        self._loaded: int | None = None  # the version the server was told to load
        self.target = HostTarget() if admin != "none" else None
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        return self._version

    def weight_target(self) -> HostTarget | None:
        return self.target

    def close(self) -> None:
        pass

    # -- HTTP ----------------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        req = urllib.request.Request(f"{self.base_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.request_timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode("utf-8", "replace")
            raise EngineError(f"POST {self.base_url}{path}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise EngineError(f"POST {self.base_url}{path}: {e}") from None
        except json.JSONDecodeError as e:
            raise EngineError(f"POST {self.base_url}{path}: not JSON ({e})") from None

    # -- generation ----------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]

    def _one(self, r: GenRequest) -> GenResult:
        version = self._version
        body: dict[str, Any] = {
            "model": self.served_model, "prompt": list(r.prompt_ids),
            "max_tokens": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p,
            "logprobs": 1, "include_stop_str_in_output": True, "skip_special_tokens": False,
            "return_tokens_as_token_ids": True, "return_token_ids": True,
        }
        if r.stop:
            body["stop"] = list(r.stop)
        if r.stop_token_ids:
            body["stop_token_ids"] = list(r.stop_token_ids)
        resp = self._post("/v1/completions", body)
        try:
            choice = resp["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise EngineError(f"completion response without choices: {str(resp)[:300]}") from None
        lp = choice.get("logprobs") or {}
        logprobs = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or []]
        ids = choice.get("token_ids")
        if ids is None:
            ids = [_token_id(t) for t in lp.get("tokens") or []]
        if len(ids) != len(logprobs):
            raise EngineError(f"server returned {len(ids)} token ids and {len(logprobs)} "
                              "logprobs; it must support return_token_ids or "
                              "return_tokens_as_token_ids with logprobs (vLLM does)")
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return GenResult([int(i) for i in ids], logprobs, [version] * len(ids), finish)

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, fn: Callable[[], T]) -> T:
        """Run the sync (into the host copy), then write a checkpoint and tell the server."""
        with self._lock:
            result = fn()
            assert self.target is not None
            version = self.target.version
            changed = self.target.take_changed()
            if version is not None and version != self._loaded and changed:
                try:
                    self._load(self._write_checkpoint(version), version)
                except BaseException:
                    self.target.changed.update(changed)  # retried at the next sync
                    raise
                self._loaded = self._version = version
            return result

    def _write_checkpoint(self, version: int) -> Path:
        from astraflow.weights.safetensors_io import write_safetensors

        assert self.target is not None
        path = self.checkpoint_dir / f"v{version:010d}"
        path.mkdir(parents=True, exist_ok=True)
        tensors = {n: (d, bits.reshape(self.target.shapes.get(n, bits.shape)))
                   for n, (d, bits) in self.target.bits.items()}
        write_safetensors(path / "model.safetensors", tensors)
        for f in self.model_path.iterdir():
            if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and not f.name.endswith(
                    ".index.json"):
                shutil.copy2(f, path / f.name)
        for old in sorted(self.checkpoint_dir.glob("v*"))[:-2]:  # keep the newest two
            shutil.rmtree(old, ignore_errors=True)
        return path

    def _load(self, path: Path, version: int) -> None:
        if self.admin == "sglang":
            resp = self._post("/update_weights_from_disk",
                              {"model_path": str(path), "weight_version": str(version)})
            if isinstance(resp, dict) and resp.get("success") is False:
                raise EngineError(f"SGLang refused weights {path}: {resp.get('message')}")
        else:
            self._post(self.admin_path, _fill(self.admin_body, str(path), version))
        log.info("server %s loaded weights version=%d from %s", self.base_url, version, path)


def _token_id(token: Any) -> int:
    if isinstance(token, str) and token.startswith("token_id:"):
        return int(token.removeprefix("token_id:"))
    raise EngineError(f"logprob token {token!r} is not 'token_id:<id>'; the server must support "
                      "return_tokens_as_token_ids or return_token_ids")


def _fill(value: Any, path: str, version: int) -> Any:
    if isinstance(value, str):
        return value.replace("{path}", path).replace("{version}", str(version))
    if isinstance(value, dict):
        return {k: _fill(v, path, version) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, path, version) for v in value]
    return value


ENGINES.add("openai", OpenAIEngine)
