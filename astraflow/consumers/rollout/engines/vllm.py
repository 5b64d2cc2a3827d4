"""The ``vllm`` engine: vLLM in-process (``vllm.LLM``), weights loaded in place.

Needs vLLM >= 0.10.2 on a CUDA GPU (written against 0.33.0). Built with
``logprobs_mode="processed_logprobs"``, so behaviour logprobs are those of the distribution that
sampled; a request finished other than ``stop`` / ``length`` fails its own episode. Between
batches, changed tensors go to every vLLM worker (:mod:`.vllm_ext`) and the prefix cache is
reset, so one batch's tokens share one version; quantized models are refused at the first
update. Details: docs/rollout.md, "The ``vllm`` engine (in-process)".
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from astraflow.consumers.rollout.engines.base import EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.engines.hf import StepGate
from astraflow.consumers.rollout.engines.target import HostTarget
from astraflow.consumers.rollout.engines.vllm_ext import Payload
from astraflow.core.records import AdapterSpec
from astraflow.weights.adapter import AdapterTarget, write_adapter_dir

log = logging.getLogger("astraflow.rollout.vllm")

T = TypeVar("T")
EXTENSION = "astraflow.consumers.rollout.engines.vllm_ext.WeightLoader"
FINISH_REASONS: dict[str, Literal["stop", "length"]] = {"stop": "stop", "length": "length"}


def chunk(sizes: Iterable[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Group (name, nbytes) into runs of at most ``max_bytes`` each, in order; a tensor larger
    than ``max_bytes`` is a run of its own."""
    runs: list[list[str]] = []
    run: list[str] = []
    held = 0
    for name, nbytes in sizes:
        if run and held + nbytes > max_bytes:
            runs.append(run)
            run, held = [], 0
        run.append(name)
        held += nbytes
    if run:
        runs.append(run)
    return runs


def payload(target: HostTarget, names: Sequence[str]) -> Payload:
    """The RPC form of ``names``' bits in ``target`` (what :func:`.vllm_ext.decode` reads)."""
    return [(n, target.bits[n][0], list(target.shapes[n]), target.bits[n][1].tobytes())
            for n in names]


def finish_reason(reason: str | None, index: int) -> Literal["stop", "length"]:
    """GenResult's finish reason for vLLM's, or :class:`EngineError` for a failed request."""
    mapped = FINISH_REASONS.get(str(reason))
    if mapped is None:
        raise EngineError(f"vLLM finished request {index} of the batch with finish_reason="
                          f"{reason!r} (valid: stop, length); abort/error mean the request "
                          "was cut off, so its episode fails instead of training on it")
    return mapped


class VLLMEngine:
    """vLLM in-process; see the module docstring."""

    name = "vllm"
    continuous = False

    def __init__(self, model_path: str | Path, *, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.85, max_batch_size: int = 256, seed: int = 0,
                 initial_version: int = 0, update_chunk_mb: float = 256,
                 vllm_args: dict[str, Any] | None = None, adapter_dir: str | Path | None = None,
                 **_: Any) -> None:
        if update_chunk_mb <= 0:
            raise EngineError(f"update_chunk_mb={update_chunk_mb}: must be > 0 (MB of changed "
                              "weights per collective_rpc call; default 256)")
        try:
            import vllm
        except ImportError:
            raise EngineError("the vllm engine needs vLLM and a CUDA GPU: pip install vllm"
                              ) from None
        args: dict[str, Any] = {
            "model": str(model_path), "dtype": dtype, "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization, "max_num_seqs": max_batch_size,
            "worker_extension_cls": EXTENSION, "logprobs_mode": "processed_logprobs",
            **(vllm_args or {})}
        try:
            self.llm = vllm.LLM(**args)
        except TypeError as e:
            if "logprobs_mode" not in str(e):
                raise
            log.warning("this vLLM has no logprobs_mode: behaviour logprobs are raw "
                        "(temperature 1), not those of the sampling distribution")
            args.pop("logprobs_mode")
            self.llm = vllm.LLM(**args)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_batch_size = max_batch_size
        self.initial_version = initial_version
        self.update_chunk_bytes = int(update_chunk_mb * 2**20)
        self.quantization = getattr(getattr(self.llm, "model_config", None), "quantization", None)
        if self.quantization is not None:
            log.warning("model=%s quantization=%s: weight updates will be refused (tensor "
                        "deltas need an unquantized model)", model_path, self.quantization)
        self.target = HostTarget()
        # LoRA versions: written as peft adapter folders and served through LoRARequest
        self._weights = AdapterTarget(self.target, self._take_adapter)
        self.lora_enabled = bool(args.get("enable_lora"))
        self._own_adapter_dir = adapter_dir is None  # a temporary one, removed at close
        self.adapter_dir = Path(adapter_dir) if adapter_dir else Path(
            tempfile.mkdtemp(prefix="af-vllm-lora-"))
        self.lora_request: Any = None  # the adapter generation uses now (None: the base)
        self._new_lora: tuple[int, Path, int] | None = None  # (r, folder, version) to serve
        self.gate = StepGate()
        self._version = initial_version
        self._unsent: set[str] = set()  # changed tensors not yet loaded by every worker
        self._failed: str | None = None  # why generation is refused (a half-done update)
        self.rpc_calls = 0  # collective_rpc calls made for weights (metrics, tests)

    @property
    def version(self) -> int:
        return self._version

    def weight_target(self) -> AdapterTarget:
        return self._weights

    def _take_adapter(self, spec: AdapterSpec, tensors: dict[str, Any], version: int) -> None:
        """Write version ``version``'s adapter as a peft folder; the update then serves it
        under a new name and id (vLLM caches adapters by id: a reused id would keep serving
        the old tensors)."""
        path = write_adapter_dir(self.adapter_dir / f"v{version:010d}", spec, tensors)
        self._new_lora = (spec.r, path, version)

    def close(self) -> None:
        """Stop vLLM's engine core (its process and the GPU memory it holds). vLLM 0.33's ``LLM``
        has no ``shutdown``; the engine-core client's ``shutdown`` is what its finaliser calls."""
        llm, self.llm = getattr(self, "llm", None), None
        if getattr(self, "_own_adapter_dir", False):
            shutil.rmtree(self.adapter_dir, ignore_errors=True)
        if llm is None:
            return
        shutdown = getattr(llm, "shutdown", None)  # a later vLLM may add one
        if shutdown is None:
            shutdown = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None),
                               "shutdown", None)
        if shutdown is None:
            log.warning("this vLLM's LLM has no shutdown route; its engine core stops when the "
                        "process exits")
            return
        shutdown()

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [SamplingParams(
            n=1, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_new_tokens,
            stop=list(r.stop) or None, stop_token_ids=list(r.stop_token_ids) or None,
            logprobs=0, include_stop_str_in_output=True, skip_special_tokens=False)
            for r in requests]
        self.gate.acquire()
        try:
            if self.llm is None:
                raise EngineError("the vllm engine is closed")
            if self._failed:
                raise EngineError(self._failed)
            version = self._version
            lora = {"lora_request": self.lora_request} if self.lora_request is not None else {}
            outs = self.llm.generate(prompts, params, use_tqdm=False, **lora)
        finally:
            self.gate.release()
        results = []
        for i, out in enumerate(outs):
            c = out.outputs[0]
            try:
                finish = finish_reason(c.finish_reason, i)
            except EngineError as e:  # this request fails; the batch's others go on
                results.append(GenResult([], [], [], "stop", error=str(e)))
                continue
            ids = [int(t) for t in c.token_ids]
            if c.logprobs is None or len(c.logprobs) != len(ids):
                raise EngineError(f"vLLM returned {len(ids)} tokens and "
                                  f"{len(c.logprobs or [])} logprobs for request {i}")
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs, ids, strict=True)]
            results.append(GenResult(ids, lps, [version] * len(ids), finish))
        return results

    def update_weights(self, fn: Callable[[], T]) -> T:
        def run() -> T:
            if self.quantization is not None:
                # before fn(): the syncer must not count a version the workers cannot load
                raise EngineError(
                    f"the vllm engine cannot update a quantized model (quantization="
                    f"{self.quantization!r}) tensor by tensor; serve an unquantized "
                    "checkpoint, or turn rollout.weights.enabled off for fixed weights")
            result = fn()
            self._unsent.update(self.target.take_changed())
            if self._unsent or self._failed:
                self._failed = ("a weight update did not finish: the workers hold a mix of "
                                "versions; generation waits for the next update")
                self._send(sorted(self._unsent))
                self._reset_cache()
                self._failed = None
            if self._new_lora is not None:  # kept until served: a refusal is retried
                self._switch_lora(*self._new_lora)
                self._new_lora = None
            if self.target.version is not None:
                self._version = self.target.version
            return result

        return self.gate.update(run)

    def _switch_lora(self, r: int, path: Path, version: int) -> None:
        """Serve the adapter in ``path`` from the next batch on; drop the previous adapter
        (vLLM's engine ``remove_lora`` where it has one; its LRU of adapters evicts it
        otherwise) and its folder. The prefix cache needs no reset: vLLM keys cached blocks by
        adapter."""
        from vllm.lora.request import LoRARequest

        if not self.lora_enabled:
            raise EngineError("the trainer publishes LoRA adapters (trainer.lora) but this vLLM "
                              "was started without LoRA: set rollout.engine.vllm_args: "
                              f"{{enable_lora: true, max_lora_rank: {r}}} (or larger)")
        old = self.lora_request
        self.lora_request = LoRARequest(f"af-v{version}", version + 1, str(path))
        if old is None:
            return
        remove = getattr(getattr(self.llm, "llm_engine", None), "remove_lora", None)
        if remove is not None:
            remove(old.lora_int_id)
        shutil.rmtree(old.lora_path, ignore_errors=True)

    def _send(self, names: Sequence[str]) -> None:
        """Load ``names`` on every worker, one RPC per run of at most update_chunk_bytes."""
        sizes = ((n, self.target.bits[n][1].nbytes) for n in names)
        for run in chunk(sizes, self.update_chunk_bytes):
            loaded = self.llm.collective_rpc("af_load_weights", args=(payload(self.target, run),))
            self.rpc_calls += 1
            if any(n != len(run) for n in loaded):
                raise EngineError(f"vLLM workers loaded {loaded} tensors of {len(run)} sent")
            self._unsent.difference_update(run)

    def _reset_cache(self) -> None:
        """Drop the prefix cache: its KV blocks were computed with the old weights and its key
        does not include them, so GRPO's repeated prompts and shared system prompts would reuse
        them. vLLM 0.33's ``LLM.reset_prefix_cache()`` returns False only when KV blocks are
        still held by unfinished requests (``BlockPool.reset_prefix_cache``). Updates run
        between ``generate`` calls, under the gate, and ``LLM.generate`` returns only when all
        its requests finished, so False means something else holds blocks: an error, not a
        retry. (Salting prompts with the version, ``TokensPrompt(cache_salt=...)``, would also
        work while requests run, but leaves the old version's blocks occupying the cache until
        evicted; the reset is the RLHF route vLLM documents.)"""
        if not self.llm.reset_prefix_cache():
            raise EngineError("vLLM refused to reset its prefix cache after a weight update "
                              "(KV blocks still in use by unfinished requests); its cached KV "
                              "is from the old weights, so generation is refused until the "
                              "next update succeeds")

