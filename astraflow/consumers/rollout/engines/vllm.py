"""The ``vllm`` engine: vLLM in-process (``vllm.LLM``), weights loaded in place.

Generation is ``LLM.generate`` on token-id prompts with ``SamplingParams(logprobs=0)`` (the
sampled token's logprob), stop strings kept in the output. The engine is built with
``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2) so behaviour logprobs are those of the
temperature-scaled, top-p-filtered distribution that sampled; an older vLLM without that option
reports raw logprobs (a warning says so).

Weights: the syncer keeps bf16 bits on the host (:class:`HostTarget`); between two
``generate`` calls the changed tensors go to every vLLM worker through ``collective_rpc`` to a
worker extension (:mod:`.vllm_ext`) that calls the model's ``load_weights`` in place, the route
vLLM's RLHF examples document. Updates land between batches (the batcher's calls), not between
decoding steps inside a batch: tokens of one batch share one version.

Not exercised in this repository's CI (no GPU): its tests are marked ``gpu`` and skipped where
vLLM or CUDA is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from astraflow.consumers.rollout.engines.base import ENGINES, EngineError, GenRequest, GenResult
from astraflow.consumers.rollout.engines.hf import StepGate
from astraflow.consumers.rollout.engines.target import HostTarget

log = logging.getLogger("astraflow.rollout.vllm")

T = TypeVar("T")
EXTENSION = "astraflow.consumers.rollout.engines.vllm_ext.WeightLoader"


class VLLMEngine:
    """vLLM in-process; see the module docstring."""

    name = "vllm"
    continuous = False

    def __init__(self, model_path: str | Path, *, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.85, max_batch_size: int = 256, seed: int = 0,
                 initial_version: int = 0, vllm_args: dict[str, Any] | None = None,
                 **_: Any) -> None:
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
        self.target = HostTarget()
        self.gate = StepGate()
        self._version = initial_version

    @property
    def version(self) -> int:
        return self._version

    def weight_target(self) -> HostTarget:
        return self.target

    def close(self) -> None:
        pass

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
            version = self._version
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        finally:
            self.gate.release()
        results = []
        for out in outs:
            c = out.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=True)]
            results.append(GenResult(ids, lps, [version] * len(ids),
                                     "length" if c.finish_reason == "length" else "stop"))
        return results

    def update_weights(self, fn: Callable[[], T]) -> T:
        def run() -> T:
            result = fn()
            names = self.target.take_changed()
            if names:
                payload = [(n, self.target.bits[n][0], list(self.target.shapes[n]),
                            self.target.bits[n][1].tobytes()) for n in names]
                self.llm.collective_rpc("af_load_weights", args=(payload,))
            if self.target.version is not None:
                self._version = self.target.version
            return result

        return self.gate.update(run)


ENGINES.add("vllm", VLLMEngine)
