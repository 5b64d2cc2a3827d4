"""Inference engines behind one protocol (:mod:`.base`): ``hf``, ``vllm``, ``openai``.

Each engine module is imported only when an engine of its type is built.

Modules:

- :mod:`.adapters`: Several policies as LoRA adapters of one base, served by one ``hf`` engine.
- :mod:`.base`: The engine protocol: token ids in, token ids + behaviour logprobs + versions out.
- :mod:`.hf`: The ``hf`` engine: a transformers causal LM in-process (CPU or GPU), batched
  sampling.
- :mod:`.hf_continuous`: Continuous batching (iteration-level scheduling) for the ``hf`` engine.
- :mod:`.hf_process`: The ``hf`` engine in a process of its own (``rollout.engine.process: true``).
- :mod:`.openai`: The ``openai`` engine: any OpenAI-compatible ``/v1/completions`` server (vLLM,
  SGLang).
- :mod:`.openai_server`: What the ``openai`` engine needs to know about the server behind it, and
  its update gate.
- :mod:`.sampling`: Sampling and stop checks shared by the in-process engines (torch imported
  lazily).
- :mod:`.speed`: A slower engine on the same hardware: ``rollout.engine.speed``.
- :mod:`.target`: Weight targets of the rollout engines: where the syncer puts new weight versions.
- :mod:`.vllm`: The ``vllm`` engine: vLLM in-process (``vllm.LLM``), weights loaded in place.
- :mod:`.vllm_ext`: vLLM worker extension (``worker_extension_cls``): loads changed weight tensors
  in place.
"""

from astraflow.consumers.rollout.engines.base import (
    ENGINES,
    Engine,
    EngineError,
    GenRequest,
    GenResult,
    build_engine,
)

__all__ = ["ENGINES", "Engine", "EngineError", "GenRequest", "GenResult", "build_engine"]
