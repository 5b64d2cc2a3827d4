"""Inference engines behind one protocol (:mod:`.base`): ``hf``, ``vllm``, ``openai``.

Each engine module is imported only when an engine of its type is built.

Modules:

- :mod:`.adapters`: several LoRA policies of one base in one ``hf`` engine.
- :mod:`.base`: the engine protocol and :func:`~.base.build_engine`.
- :mod:`.hf`: the ``hf`` engine: a transformers model in-process.
- :mod:`.hf_continuous`: continuous batching for the ``hf`` engine.
- :mod:`.hf_process`: the ``hf`` engine in a process of its own.
- :mod:`.openai`: the ``openai`` engine: an OpenAI-compatible server.
- :mod:`.openai_server`: server probe, logprob check and update gate of ``openai``.
- :mod:`.sampling`: sampling and stop checks of the in-process engines.
- :mod:`.speed`: a slower engine on the same hardware (``rollout.engine.speed``).
- :mod:`.target`: weight targets: where the syncer puts new versions.
- :mod:`.vllm`: the ``vllm`` engine: vLLM in-process.
- :mod:`.vllm_ext`: the vLLM worker extension that loads changed tensors.
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
