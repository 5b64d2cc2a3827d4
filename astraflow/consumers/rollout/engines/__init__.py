"""Inference engines behind one protocol (:mod:`.base`): ``hf``, ``vllm``, ``openai``.

Each engine module is imported only when an engine of its type is built."""

from astraflow.consumers.rollout.engines.base import (
    ENGINES,
    Engine,
    EngineError,
    GenRequest,
    GenResult,
    build_engine,
)

__all__ = ["ENGINES", "Engine", "EngineError", "GenRequest", "GenResult", "build_engine"]
