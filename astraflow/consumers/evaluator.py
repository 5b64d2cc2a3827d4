"""The evaluator: follows ``weights.<policy>`` and measures held-out greedy accuracy of each
new version (a consumer like any other; the trainer never waits for it).

For every version it reaches (skipping versions that arrive while it is busy), it decodes the
held-out problems greedily in batches, scores them with the experiment's reward, and emits
``eval_step`` (the weight version) and ``eval_accuracy`` (0..1) on the metrics topic; `astraflow
run` turns those into the evaluation lines of ``metrics.jsonl``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.producers.sources import TaskSpec

if TYPE_CHECKING:
    from astraflow.consumers.rollout.config import RewardConfig
    from astraflow.models.config import ModelConfig
    from astraflow.producers.config import ProducerConfig
    from astraflow.weights.config import WeightsConfig

log = logging.getLogger("astraflow.evaluator")


@dataclass
class EvalResult:
    version: int
    accuracy: float
    n: int
    seconds: float


def held_out(producer: ProducerConfig, limit: int) -> list[TaskSpec]:
    """The held-out problems of the experiment's arithmetic producer (its test split)."""
    from astraflow.producers.arithmetic import arithmetic

    if producer.source != "arithmetic":
        from astraflow.core.errors import ConfigError

        raise ConfigError("evaluation needs held-out problems: producer.source=arithmetic "
                          f"has a test split; {producer.source!r} has none yet")
    cfg = producer.arithmetic.model_copy(update={"split": "test", "count": None})
    return [spec for spec, _ in arithmetic(cfg)][:limit]


def greedy_accuracy(model: Any, tokenizer: Any, specs: Sequence[TaskSpec],
                    score: Callable[[str, dict[str, Any]], float], *, max_new_tokens: int,
                    batch_size: int = 256) -> float:
    """Fraction of ``specs`` whose greedy completion scores > 0.5."""
    import torch

    from astraflow.models.prompt import render_prompt

    pad = tokenizer.pad_token_id
    right = 0
    for i in range(0, len(specs), batch_size):
        chunk = specs[i:i + batch_size]
        prompts = [render_prompt(tokenizer, s.prompt)[1] for s in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        att = (torch.arange(width)[None, :] >= torch.tensor(
            [width - len(p) for p in prompts])[:, None]).long()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=pad,
                                 eos_token_id=tokenizer.eos_token_id)
        for spec, row in zip(chunk, out[:, width:].tolist(), strict=True):
            text = tokenizer.decode(row, skip_special_tokens=True)
            right += float(score(text, spec.reference)) > 0.5
    return right / max(1, len(specs))


class Evaluator:
    """Greedy held-out accuracy of every weight version it can reach."""

    def __init__(self, *, run: str, policy: str, model: ModelConfig, producer: ProducerConfig,
                 reward: RewardConfig, max_new_tokens: int, weights: WeightsConfig,
                 out: str | Path, bus: Any, limit: int = 500, metrics: Any = None,
                 component: str | None = None) -> None:
        from astraflow.consumers.rollout.engines.target import ModelTarget
        from astraflow.consumers.rollout.rewards import build_reward
        from astraflow.core.metrics import component_id
        from astraflow.core.topics import topic_name
        from astraflow.models.config import model_dir
        from astraflow.models.tiny import load
        from astraflow.weights.config import build_syncer

        self.policy = policy
        self.metrics = metrics
        self.bus = bus
        self.dlq = topic_name(run, "dlq")
        # unique per process: two evaluators of one policy must not share a label
        self.component = component or (metrics.component if metrics is not None
                                       else component_id(f"evaluator-{policy}"))
        self.model, self.tokenizer = load(model_dir(model, policy, out))
        self.model.eval()
        self.specs = held_out(producer, limit)
        self.reward = build_reward(reward)
        self.max_new_tokens = max_new_tokens
        self.target = ModelTarget(self.model)
        self.syncer = build_syncer(bus, weights, self.target, run=run, policy=policy,
                                   worker="evaluator", out=out)
        self.results: list[EvalResult] = []

    def evaluate(self, version: int) -> EvalResult:
        t0 = time.monotonic()
        acc = greedy_accuracy(self.model, self.tokenizer, self.specs, self._score,
                              max_new_tokens=self.max_new_tokens)
        res = EvalResult(version, acc, len(self.specs), time.monotonic() - t0)
        self.results.append(res)
        log.info("eval version=%d accuracy=%.4f n=%d seconds=%.1f", version, acc, res.n,
                 res.seconds)
        if self.metrics is not None:
            self.metrics.set("eval_step", version)
            self.metrics.set("eval_accuracy", acc)
            self.metrics.set("weight_version", version)
            self.metrics.inc("evaluations")
            self.metrics.emit()
        return res

    def _score(self, text: str, reference: dict[str, Any]) -> float:
        return float(self.reward(text, reference))

    def run(self, *, max_evals: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] = lambda: False, initial: bool = True,
            every: int = 1, idle_s: float = 2.0) -> None:
        """Evaluate the initial weights (as version 0), then a version whenever ``every``
        versions passed since the last evaluation — or when the newest version reached has
        not been followed by another for ``idle_s`` seconds (so the final version of a run is
        always evaluated) — until stopped. A handler without inputs on the processor
        runtime, which owns stopping (the syncer reads ``weights.<policy>`` itself)."""
        from astraflow.core.stream import Processor, Stateless

        self._max_evals, self._every, self._idle_s = max_evals, every, idle_s
        if initial:
            self.evaluate(0)
        self._last = self._newest = 0
        self._newest_at = time.monotonic()
        handler = Stateless(tick=self._follow, done=self._done)
        proc = Processor(self.bus, handler, [], dlq=self.dlq, component=self.component)
        try:
            proc.run(timeout=timeout, should_stop=should_stop)
        finally:
            proc.close()

    def _done(self) -> bool:
        return self._max_evals is not None and len(self.results) >= self._max_evals

    def _follow(self) -> list[Any]:
        version = self.syncer.sync_once(timeout=0.5)
        if version is not None and version > self._newest:
            self._newest, self._newest_at = version, time.monotonic()
        due = self._newest - self._last >= self._every or (
            self._newest > self._last and time.monotonic() - self._newest_at >= self._idle_s)
        if due:
            self._last = self._newest
            self.evaluate(self._newest)
        elif self.metrics is not None:
            self.metrics.tick()
        return []
