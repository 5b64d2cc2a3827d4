"""The ``openai`` engine: any OpenAI-compatible ``/v1/completions`` server (vLLM, SGLang).

Requests carry token-id prompts and every sampling field; the server batches them (up to
``max_batch_size`` in flight). A request whose logprobs would be of another distribution is
refused (:func:`.openai_server.logprob_problem`); a finish reason other than ``stop`` /
``length`` is an :class:`EngineError`. Weight versions are written under ``checkpoint_dir`` and
loaded by the server (``admin``) while none of this engine's requests run
(:class:`.openai_server.UpdateGate`). Details: docs/rollout.md, "Serving with vLLM or SGLang".
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

from astraflow.consumers.rollout.engines.base import EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.engines.openai_server import (
    ServerInfo,
    UpdateGate,
    logprob_problem,
    probe_server,
    unverified,
)
from astraflow.consumers.rollout.engines.target import HostTarget
from astraflow.core.records import AdapterSpec
from astraflow.weights.adapter import AdapterTarget, write_adapter_dir

log = logging.getLogger("astraflow.rollout.openai")

T = TypeVar("T")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
ADMINS = ("none", "sglang", "vllm", "custom")
SERVERS = ("auto", "vllm", "sglang")
# Sent with every request: the values that leave the distribution as temperature/top-p make it.
NEUTRAL_SAMPLING: dict[str, Any] = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                    "presence_penalty": 0.0, "frequency_penalty": 0.0}
_VLLM_FIELDS = {"include_stop_str_in_output": True, "return_tokens_as_token_ids": True}
_SGLANG_FIELDS = {"no_stop_trim": True}
_LORA_HINT = {
    "vllm": "vLLM serves /v1/load_lora_adapter only when started with --enable-lora "
            "--max-lora-rank <r> and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its environment",
    "sglang": "SGLang serves /load_lora_adapter when started with --enable-lora "
              "--max-lora-rank <r> --lora-target-modules <modules>"}
_VLLM_DEV_HINT = ("vLLM serves /collective_rpc, /reset_prefix_cache and /update_weight_version "
                  "only when started with VLLM_SERVER_DEV_MODE=1 in its environment")


class ServerHTTPError(EngineError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class OpenAIEngine:
    """A client of an OpenAI-compatible completion server; see the module docstring."""

    name = "openai"
    continuous = True

    def __init__(self, model_path: str | Path, *, base_url: str = "http://127.0.0.1:8000",
                 served_model: str | None = None, api_key: str | None = None,
                 request_timeout: float = 120.0, max_batch_size: int = 64,
                 server: str = "auto", check_logprobs: bool = True,
                 admin: str = "none", admin_path: str | None = None,
                 admin_body: dict[str, Any] | None = None, admin_timeout: float = 1800.0,
                 checkpoint_dir: str | Path | None = None, initial_version: int = 0,
                 tokenizer: Any = None, **_: Any) -> None:
        if admin not in ADMINS:
            raise EngineError(f"unknown admin {admin!r}; valid: {', '.join(ADMINS)}")
        if server not in SERVERS:
            raise EngineError(f"unknown server {server!r}; valid: {', '.join(SERVERS)}")
        if admin in ("vllm", "sglang") and server not in ("auto", admin):
            raise EngineError(f"admin {admin!r} loads weights into a {admin} server, but "
                              f"server is {server!r}; set server: {admin} (or auto)")
        if admin == "custom" and not admin_path:
            raise EngineError("admin 'custom' needs admin_path (the route that loads a "
                              "checkpoint directory); for vLLM use admin: vllm, for SGLang "
                              "admin: sglang")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer = tokenizer
        self.model_path = Path(model_path)
        self.base_url = base_url.rstrip("/")
        self.served_model = served_model
        self.api_key = api_key
        self.request_timeout = request_timeout
        self.max_batch_size = max_batch_size
        self.server = admin if admin in ("vllm", "sglang") and server == "auto" else server
        self.check_logprobs = check_logprobs
        self.admin = admin
        self.admin_path = admin_path
        self.admin_body = admin_body or {"weight_dir": "{path}"}
        self.admin_timeout = admin_timeout
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else self.model_path.parent / (
            f"{self.model_path.name}-rollout-weights")
        self._version = initial_version
        self._loaded: int | None = None  # the version the server was told to load
        self.target = HostTarget() if admin != "none" else None
        # LoRA versions: a peft adapter folder per version, loaded by the server's dynamic
        # LoRA route under a new name, which requests then name as their model
        self._weights = (AdapterTarget(self.target, self._take_adapter)
                         if self.target is not None else None)
        self.lora_name: str | None = None  # the adapter requests name now (None: the base)
        self._new_lora: tuple[str, Path, int] | None = None  # written by the sync, not loaded
        self._lock = threading.Lock()  # one update at a time
        self.gate = UpdateGate()  # requests vs. updates
        self._info: ServerInfo | None = None
        self._info_lock = threading.Lock()
        self._warned: set[str] = set()
        self._broken: str | None = None  # why the server's weights are unknown, if they are

    @property
    def version(self) -> int:
        return self._version

    @property
    def info(self) -> ServerInfo:
        """What the server is (asked once, on first use: the server may start after us)."""
        with self._info_lock:
            if self._info is None:
                self._info = probe_server(self._get_or_none, self.server)
                log.info("server %s is %s (logprobs_mode=%s)", self.base_url, self._info.kind,
                         self._info.logprobs_mode)
                warning = unverified(self._info)
                if warning:
                    log.warning("%s: %s", self.base_url, warning)
            return self._info

    def weight_target(self) -> AdapterTarget | None:
        return self._weights

    def _take_adapter(self, spec: AdapterSpec, tensors: dict[str, Any], version: int) -> None:
        if self.admin not in ("vllm", "sglang"):
            raise EngineError(f"the trainer publishes LoRA adapters (trainer.lora); admin "
                              f"{self.admin!r} has no adapter route: use admin: vllm or sglang")
        name = f"af-v{version}"
        path = write_adapter_dir(self.checkpoint_dir / f"lora-v{version:010d}", spec, tensors)
        self._new_lora = (name, path, version)

    def close(self) -> None:
        pass

    # -- HTTP ----------------------------------------------------------------------------------
    def _http(self, method: str, path: str, body: dict[str, Any] | None = None,
              timeout: float | None = None, text: bool = False) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        where = f"{method} {self.base_url}{path}"
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.request_timeout) as resp:
                raw = resp.read()
                if text:  # vLLM's LoRA routes answer 200 with plain text ("Success: ...")
                    return raw.decode("utf-8", "replace")
                return json.loads(raw or b"{}")
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode("utf-8", "replace")
            raise ServerHTTPError(f"{where}: HTTP {e.code}: {detail}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise EngineError(f"{where}: {e}") from None
        except json.JSONDecodeError as e:
            raise EngineError(f"{where}: not JSON ({e})") from None

    def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        return self._http("POST", path, body, timeout)

    def _get_or_none(self, path: str) -> Any:
        try:
            return self._http("GET", path)
        except ServerHTTPError as e:
            if e.status in (404, 405, 501):  # no such route: what the probe wants to know
                return None
            raise

    # -- generation ----------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]

    def request_body(self, r: GenRequest) -> dict[str, Any]:
        """The ``/v1/completions`` body for ``r`` (see the module docstring)."""
        kind = self.info.kind
        body: dict[str, Any] = {
            "prompt": list(r.prompt_ids), "max_tokens": r.max_new_tokens,
            "temperature": r.temperature, "top_p": r.top_p, **NEUTRAL_SAMPLING,
            "logprobs": 1, "skip_special_tokens": False, "return_token_ids": True,
            **(_VLLM_FIELDS if kind != "sglang" else {}),
            **(_SGLANG_FIELDS if kind != "vllm" else {}),
        }
        if self.lora_name:  # LoRA: the adapter loaded for the current version
            body["model"] = self.lora_name
        elif self.served_model:
            body["model"] = self.served_model
        if r.stop:
            body["stop"] = list(r.stop)
        if r.stop_token_ids:
            body["stop_token_ids"] = list(r.stop_token_ids)
        return body

    def _one(self, r: GenRequest) -> GenResult:
        problem = logprob_problem(self.info, r.temperature, r.top_p)
        if problem:
            if self.check_logprobs:
                raise EngineError(f"{self.base_url}: {problem} (or set check_logprobs: false "
                                  "to train on them anyway)")
            if problem not in self._warned:
                self._warned.add(problem)
                log.warning("%s: %s", self.base_url, problem)
        body = self.request_body(r)
        with self.gate.shared():
            if self._broken:
                raise EngineError(f"{self.base_url}: the server's weights are unknown after a "
                                  f"failed update ({self._broken}); requests fail until the "
                                  "next weight sync loads a version")
            version = self._version
            resp = self._post("/v1/completions", body)
        return _parse_choice(resp, version)

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, fn: Callable[[], T]) -> T:
        """Run the sync (into the host copy), write a checkpoint, then, with no request in
        flight, tell the server to load it."""
        with self._lock:
            result = fn()
            assert self.target is not None
            version = self.target.version
            changed = self.target.take_changed()
            if self._new_lora is not None:
                self._switch_lora(*self._new_lora)
                self._new_lora = None
                return result
            if version is not None and version != self._loaded and changed:
                try:
                    path = self._write_checkpoint(version)
                    with self.gate.exclusive():
                        try:
                            self._load(path, version)
                        except BaseException as e:
                            self._broken = f"loading version {version}: {e}"
                            raise
                        self._loaded = self._version = version
                        self._broken = None
                except BaseException:
                    self.target.changed.update(changed)  # retried at the next sync
                    raise
            return result

    def _switch_lora(self, name: str, path: Path, version: int) -> None:
        """With no request in flight: load adapter ``name`` from ``path``, name it in requests
        from now on, and unload the previous one (its folder removed). No prefix-cache reset:
        both servers key cached prefixes by adapter."""
        prefix = "/v1" if self.admin == "vllm" else ""
        timeout = self.admin_timeout + 30
        with self.gate.exclusive():
            try:
                resp = self._http("POST", f"{prefix}/load_lora_adapter",
                                  {"lora_name": name, "lora_path": str(path)}, timeout,
                                  text=self.admin == "vllm")
            except ServerHTTPError as e:
                if e.status in (404, 405):
                    raise EngineError(f"{e}; {_LORA_HINT[self.admin]}") from None
                raise
            if isinstance(resp, dict) and resp.get("success") is False:  # SGLang's answer
                raise EngineError(f"{self.base_url} refused LoRA adapter {path}: "
                                  f"{resp.get('error_message') or resp}")
            old, self.lora_name = self.lora_name, name
            self._loaded = self._version = version
            self._broken = None
            if old is not None:
                self._http("POST", f"{prefix}/unload_lora_adapter", {"lora_name": old},
                           timeout, text=self.admin == "vllm")
                shutil.rmtree(self.checkpoint_dir / f"lora-v{int(old.removeprefix('af-v')):010d}",
                              ignore_errors=True)
        log.info("server %s serves LoRA adapter %s (version=%d) from %s", self.base_url, name,
                 version, path)

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
        # The HTTP timeout outlasts the server's own work (and, for SGLang, its wait for the
        # requests of other clients in flight).
        timeout = self.admin_timeout + 30
        if self.admin == "sglang":
            resp = self._post("/update_weights_from_disk",
                              {"model_path": str(path), "weight_version": str(version)}, timeout)
            if isinstance(resp, dict) and resp.get("success") is False:
                raise EngineError(f"SGLang refused weights {path}: {resp.get('message')}")
        elif self.admin == "vllm":
            self._load_vllm(path, version, timeout)
        else:
            assert self.admin_path is not None
            self._post(self.admin_path, _fill(self.admin_body, str(path), version), timeout)
        log.info("server %s loaded weights version=%d from %s", self.base_url, version, path)

    def _load_vllm(self, path: Path, version: int, timeout: float) -> None:
        try:
            self._post("/collective_rpc", {"method": "reload_weights",
                                           "kwargs": {"weights_path": str(path)},
                                           "timeout": self.admin_timeout}, timeout)
            reset = self._post("/reset_prefix_cache", {}, timeout)
            if not (isinstance(reset, dict) and reset.get("success") is True):
                raise EngineError(
                    f"vLLM at {self.base_url} did not reset its prefix cache after loading "
                    f"{path} (answer: {reset}); its cached KV would come from the old weights. "
                    "It fails while requests hold cache blocks: are other clients using "
                    "this server?")
            self._post("/update_weight_version", {"new_version": str(version)}, timeout)
        except ServerHTTPError as e:
            if e.status == 404:
                raise EngineError(f"{e}; {_VLLM_DEV_HINT}") from None
            raise


def _parse_choice(resp: Any, version: int) -> GenResult:
    try:
        choice = resp["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise EngineError(f"completion response without choices: {str(resp)[:300]}") from None
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        # abort (SGLang, vLLM), error (vLLM), content_filter, repetition, None: not a sample
        # of the policy's distribution to train on.
        raise EngineError(f"the server ended the generation with finish_reason={finish!r} "
                          f"({str(choice.get('stop_reason') or choice.get('matched_stop'))[:200]}"
                          "); the episode fails")
    lp = choice.get("logprobs") or {}
    raw = lp.get("token_logprobs") or []
    if any(x is None for x in raw):
        raise EngineError(f"the server returned a null logprob for a generated token: {raw[:20]}")
    logprobs = [float(x) for x in raw]
    ids = choice.get("token_ids")
    if ids is None:
        ids = [_token_id(t) for t in lp.get("tokens") or []]
    if len(ids) != len(logprobs):
        raise EngineError(f"server returned {len(ids)} token ids and {len(logprobs)} "
                          "logprobs; it must support return_token_ids or "
                          "return_tokens_as_token_ids with logprobs (vLLM and SGLang do)")
    return GenResult([int(i) for i in ids], logprobs, [version] * len(ids), finish)


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

