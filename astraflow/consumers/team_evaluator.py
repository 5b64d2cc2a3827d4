"""The team evaluator: follows ``weights.<policy>`` of every policy of a ``solver_verifier`` team
and measures the whole episode on held-out problems, greedily.

It runs the workflow itself (:func:`~astraflow.consumers.rollout.runtime.run_episode`, ``hf``
engines at temperature 0) on every held-out problem at once: what the rollout workers run,
minus the sampling. Per evaluation it emits ``system_accuracy``, ``first_accuracy``,
``retry_rate``, ``unclear_rate``, ``error_rate``, ``version.<policy>`` and ``eval_step`` (the
solver's version); what each means: docs/evaluation.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.consumers.episodes import greedy_episodes
from astraflow.consumers.evaluator import VersionWatch, follow, held_out
from astraflow.producers.sources import TaskSpec

if TYPE_CHECKING:
    from astraflow.consumers.rollout.config import RewardConfig
    from astraflow.consumers.rollout.engines.base import Engine
    from astraflow.models.config import ModelConfig
    from astraflow.producers.config import ProducerConfig
    from astraflow.weights.config import WeightsConfig

log = logging.getLogger("astraflow.evaluator")

WORKFLOW = "solver_verifier"


@dataclass
class TeamResult:
    versions: dict[str, int]  # policy -> weight version evaluated
    system_accuracy: float
    first_accuracy: float
    retry_rate: float
    unclear_rate: float
    error_rate: float
    n: int
    seconds: float = 0.0

    def describe(self) -> str:
        return (f"versions {self.versions}: system accuracy {self.system_accuracy:.4f}, first "
                f"answer {self.first_accuracy:.4f}, retry rate {self.retry_rate:.4f} ({self.n} "
                f"problems, {self.seconds:.1f}s)")

    def gauges(self) -> dict[str, float]:
        return {"system_accuracy": self.system_accuracy, "first_accuracy": self.first_accuracy,
                "retry_rate": self.retry_rate, "unclear_rate": self.unclear_rate,
                "error_rate": self.error_rate}


def team_episodes(engines: Mapping[str, Engine], specs: Sequence[TaskSpec], *,
                  reward: str = "exact_match", reward_kwargs: Mapping[str, Any] | None = None,
                  workflow_kwargs: Mapping[str, Any] | None = None, max_new_tokens: int = 64,
                  threshold: float = 0.5, extract: str = "none") -> TeamResult:
    """Run the ``solver_verifier`` episode greedily on every spec at once (the engines batch
    the concurrent turns) and score the team. ``engines``: policy -> engine, every policy the
    workflow's roles map to."""
    t0 = time.monotonic()
    outcomes = greedy_episodes(engines, specs, workflow=WORKFLOW, reward=reward,
                               reward_kwargs=reward_kwargs, workflow_kwargs=workflow_kwargs,
                               max_new_tokens=max_new_tokens, extract=extract)
    final = first = retried = unclear = errors = 0
    for out in outcomes:
        # the solver's record: the one with its reward components (a policy may play both)
        d = next((d for d in out.drafts if "first_answer" in d.rewards), None)
        if out.error is not None or d is None:
            errors += 1
            continue
        final += d.rewards.get("final_answer", 0.0) > threshold
        first += d.rewards.get("first_answer", 0.0) > threshold
        retried += d.rewards.get("retried", 0.0) > 0.5
        unclear += out.ctx.counters.get("verdict_unclear", 0.0) > 0
    n = max(1, len(outcomes))
    return TeamResult(versions={p: e.version for p, e in engines.items()},
                      system_accuracy=final / n, first_accuracy=first / n,
                      retry_rate=retried / n, unclear_rate=unclear / n, error_rate=errors / n,
                      n=len(outcomes), seconds=time.monotonic() - t0)


class TeamEvaluator:
    """System accuracy of a ``solver_verifier`` team at every combination of versions it
    reaches (see the module docstring). ``team``: role -> policy."""

    def __init__(self, *, run: str, team: Mapping[str, str], models: Mapping[str, ModelConfig],
                 producer: ProducerConfig, reward: RewardConfig, max_new_tokens: int,
                 weights: WeightsConfig, out: str | Path, bus: Any, limit: int = 500,
                 workflow_kwargs: Mapping[str, Any] | None = None, metrics: Any = None,
                 component: str | None = None) -> None:
        from astraflow.consumers.rollout.engines.hf import HFEngine
        from astraflow.core.metrics import component_id
        from astraflow.core.topics import topic_name
        from astraflow.models.config import model_dir
        from astraflow.models.tiny import load
        from astraflow.weights.config import build_syncer

        self.team = dict(team)
        self.policies = list(dict.fromkeys(self.team.values()))
        self.solver = self.team.get("solver", self.policies[0])
        self.metrics = metrics
        self.bus = bus
        self.dlq = topic_name(run, "dlq")
        self.component = component or (metrics.component if metrics is not None
                                       else component_id("evaluator-team"))
        self.specs = held_out(producer, limit, out)
        self.engines: dict[str, Engine] = {}
        self.syncers: dict[str, Any] = {}
        for p in self.policies:
            model, tok = load(model_dir(models[p], p, out))
            engine = HFEngine(model=model, tokenizer=tok, max_batch_size=max(1, len(self.specs)))
            self.engines[p] = engine
            self.syncers[p] = build_syncer(bus, weights, engine.weight_target(), run=run,
                                           policy=p, worker="evaluator-team", out=out)
        kw = dict(workflow_kwargs or {})
        mapped = dict(kw.get("policies") or {})
        kw["policies"] = {**mapped, **self.team}
        self.workflow_kwargs = kw
        self.reward = reward
        self.max_new_tokens = max_new_tokens
        self.results: list[TeamResult] = []

    def evaluate(self, versions: Mapping[str, int] | None = None) -> TeamResult:
        """Measure the team as its engines hold it now (``versions``: for the log only; the
        result carries the versions the engines report)."""
        res = team_episodes(self.engines, self.specs, reward=self.reward.name,
                            reward_kwargs=self.reward.kwargs, extract=self.reward.extract,
                            workflow_kwargs=self.workflow_kwargs,
                            max_new_tokens=self.max_new_tokens)
        self.results.append(res)
        log.info("eval team versions=%s system_accuracy=%.4f first_accuracy=%.4f "
                 "retry_rate=%.4f n=%d seconds=%.2f", res.versions, res.system_accuracy,
                 res.first_accuracy, res.retry_rate, res.n, res.seconds)
        if self.metrics is not None:
            for k, v in res.gauges().items():
                self.metrics.set(k, v)
            for p, v in res.versions.items():
                self.metrics.set(f"version.{p}", v)
            self.metrics.set("eval_step", res.versions[self.solver])
            self.metrics.inc("evaluations")
            self.metrics.emit()
        return res

    def run(self, *, max_evals: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] = lambda: False, initial: bool = True,
            every: int = 1, idle_s: float = 2.0) -> None:
        """Evaluate the initial weights, then whenever some policy moved ``every`` versions
        (or its newest was left alone ``idle_s`` seconds or three times the pace of versions,
        whichever is longer: :class:`VersionWatch`), until stopped (:func:`follow`)."""
        if initial:
            self.evaluate()
        follow(self.bus, dlq=self.dlq, component=self.component,
               watch=VersionWatch(self.policies, every=every, idle_s=idle_s),
               syncers=self.syncers, evaluate=self.evaluate,
               done=lambda: max_evals is not None and len(self.results) >= max_evals,
               idle=self.metrics.tick if self.metrics is not None else lambda: None,
               timeout=timeout, should_stop=should_stop)

    def close(self) -> None:
        for s in self.syncers.values():
            s.close()
