"""What the ``openai`` engine needs to know about the server behind it, and its update gate.

:func:`probe_server` finds which server it is (vLLM or SGLang) and vLLM's ``--logprobs-mode``;
:func:`logprob_problem` says whether the logprobs it reports for a request are the behaviour
logprobs of :mod:`.base`, and if not, what to change (docs/rollout.md, "Serving with vLLM or
SGLang"); :class:`UpdateGate`, a writer-preferring read/write lock, keeps requests (shared) and
weight updates (exclusive) apart, so every request runs under one known version.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

ServerKind = Literal["vllm", "sglang", "other"]

VLLM_FLAG = "--logprobs-mode processed_logprobs"


@dataclass(frozen=True, slots=True)
class ServerInfo:
    kind: ServerKind
    logprobs_mode: str | None = None  # vLLM's --logprobs-mode; None: not known


def probe_server(get: Callable[[str], Any], kind: str = "auto") -> ServerInfo:
    """Find out what the server is. ``get(path)`` returns the decoded JSON of ``GET path`` or
    None when the server answers 404; ``kind`` is the configured ``server`` (``auto``: ask)."""
    if kind == "auto":
        models = get("/v1/models") or {}
        owners = {str(m.get("owned_by", "")) for m in models.get("data") or []
                  if isinstance(m, dict)}
        kind = "vllm" if "vllm" in owners else "sglang" if "sglang" in owners else "other"
    if kind != "vllm":
        return ServerInfo(kind)  # type: ignore[arg-type]
    info = get("/server_info?config_format=json")
    mode = None
    if isinstance(info, dict):
        config = info.get("vllm_config")
        if isinstance(config, dict) and isinstance(config.get("model_config"), dict):
            mode = config["model_config"].get("logprobs_mode")
    return ServerInfo("vllm", str(mode) if mode is not None else None)


def logprob_problem(info: ServerInfo, temperature: float, top_p: float) -> str | None:
    """Why the logprobs ``info``'s server reports for a request sampled at ``temperature`` /
    ``top_p`` are not its behaviour logprobs, or None when they are (or cannot be known: see
    :func:`unverified`). Read from the servers' samplers: vLLM 0.33.0 ``v1/sample/sampler.py``,
    SGLang 0.5.23 ``srt/layers/sampler.py``."""
    if info.kind == "vllm" and info.logprobs_mode is not None:
        mode = info.logprobs_mode
        if mode == "processed_logprobs":
            return None
        if mode == "raw_logprobs" and (temperature == 0.0 or (temperature == 1.0
                                                              and top_p >= 1.0)):
            return None  # greedy ignores top-p and reports the unscaled distribution
        return (f"the vLLM server reports logprobs_mode={mode!r}, which are not the logprobs "
                f"of the distribution that samples at temperature={temperature}, top_p={top_p}; "
                f"restart it with {VLLM_FLAG}")
    if info.kind == "sglang" and top_p < 1.0 and temperature > 0.0:  # greedy: no top-p
        return (f"SGLang reports log_softmax(logits / temperature) without the top-p "
                f"renormalisation, not the logprobs of the distribution that samples at "
                f"top_p={top_p}; sample with top_p 1.0 on SGLang, or use a vLLM server started "
                f"with {VLLM_FLAG}")
    return None


def unverified(info: ServerInfo) -> str | None:
    """A warning when the meaning of the server's logprobs cannot be checked, else None."""
    if info.kind == "vllm" and info.logprobs_mode is None:
        return ("cannot read the vLLM server's --logprobs-mode (GET /server_info is served only "
                "with VLLM_SERVER_DEV_MODE=1); behaviour logprobs are right only if it was "
                f"started with {VLLM_FLAG}")
    if info.kind == "other":
        return ("the server is neither vLLM nor SGLang (GET /v1/models owned_by); its logprobs "
                "are taken as the logprobs of the sampling distribution, unchecked")
    return None


class UpdateGate:
    """Writer-preferring read/write lock: many requests, or one weight update, at a time.

    A waiting update stops new requests from starting (so a steady stream of requests cannot
    starve it) and waits for those in flight to finish.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0
        self._readers_waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._readers_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            finally:
                self._readers_waiting -= 1
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._writing and self._readers == 0)
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def counts(self) -> tuple[int, int, int]:
        """(requests in flight, requests waiting, updates waiting): for tests and logs."""
        with self._cond:
            return self._readers, self._readers_waiting, self._writers_waiting
