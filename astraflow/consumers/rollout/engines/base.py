"""The engine protocol: token ids in, token ids + behaviour logprobs + versions out.

Every engine (``hf``, ``vllm``, ``openai``) implements :class:`Engine`. The worker drives it
through an async batcher (:mod:`astraflow.consumers.rollout.batcher`): the requests of
concurrent episodes make one call of the synchronous, batched :meth:`Engine.generate`, run in a
thread; an engine with ``continuous = True`` gets each request on its own call. Behaviour
logprobs are those of the distribution that sampled each token (temperature and top-p
applied); greedy decoding reports the unscaled distribution's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from astraflow.core.errors import AstraflowError
from astraflow.core.registry import Registry

if TYPE_CHECKING:
    from astraflow.weights.target import WeightTarget

T = TypeVar("T")


class EngineError(AstraflowError):
    """An engine could not be built or failed a generation."""


@dataclass(frozen=True, slots=True)
class GenRequest:
    """One generation: continue ``prompt_ids`` by up to ``max_new_tokens`` tokens."""

    prompt_ids: Sequence[int]
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # stop strings; the output keeps them
    stop_token_ids: tuple[int, ...] = ()  # in addition to the tokenizer's EOS
    #: the LoRA adapter (its policy) of an engine serving several (rollout.engine.adapters);
    #: "": the engine's own weights. Set by the policy's view, not by workflows
    adapter: str = ""


@dataclass(slots=True)
class GenResult:
    """What an engine generated for one request (the arrays align per generated token)."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]  # policy version of the weights that produced each token
    finish_reason: Literal["stop", "length"]
    extra: dict[str, Any] = field(default_factory=dict)
    #: set when this request failed (e.g. the engine aborted it): its episode fails and is
    #: counted, the other requests of the batch go on; the arrays are then empty
    error: str | None = None


@runtime_checkable
class Engine(Protocol):
    name: str
    tokenizer: Any  # a Hugging Face tokenizer (chat template, encode, decode)
    max_batch_size: int
    continuous: bool  # True: send requests one by one; the engine batches itself

    @property
    def version(self) -> int:
        """The policy version generation uses now."""

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """Generate for a batch of requests (blocking; called from a worker thread)."""

    def weight_target(self) -> WeightTarget | None:
        """Where the weights syncer applies new versions (None: this engine cannot take them)."""

    def update_weights(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (which writes into :meth:`weight_target`) at a point where no generation
        step uses the weights, and return its result. In-flight generations continue on the
        new weights afterwards; callable from any thread."""

    def close(self) -> None: ...


EngineFactory = Callable[..., Engine]
ENGINES: Registry[EngineFactory] = Registry("engine")
# by "module:attr": each is imported when first built (they pull torch, vllm or httpx)
ENGINES.add("hf", "astraflow.consumers.rollout.engines.hf:build")
ENGINES.add("vllm", "astraflow.consumers.rollout.engines.vllm:VLLMEngine")
ENGINES.add("openai", "astraflow.consumers.rollout.engines.openai:OpenAIEngine")


def build_engine(type: str, **kwargs: Any) -> Engine:  # noqa: A002 - the config key is `type`
    """Build an engine by type (``hf``, ``vllm``, ``openai``); imports it lazily."""
    if type not in ENGINES:
        raise EngineError(f"unknown engine type {type!r}; valid: {', '.join(ENGINES.names())}")
    return ENGINES.resolve(type)(**kwargs)
