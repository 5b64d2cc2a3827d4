"""The evaluator: follows ``weights.<policy>`` and measures each new version of one policy on
held-out data, greedily (the trainer never waits for it).

By the policy's ``kind``: ``answer`` scores the greedy answer with the reward; ``episode`` runs
the multi-turn workflow (:mod:`astraflow.consumers.episodes`); ``verdict`` measures a
verifier's balanced accuracy on right and wrong claims. Each version it reaches (skipping those
that arrive while it is busy) yields ``eval_step`` and gauges on ``metrics``
(docs/evaluation.md).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from astraflow.producers.sources import TaskSpec

if TYPE_CHECKING:
    from astraflow.consumers.rollout.config import RewardConfig
    from astraflow.models.config import ModelConfig
    from astraflow.producers.config import ProducerConfig
    from astraflow.weights.config import WeightsConfig

log = logging.getLogger("astraflow.evaluator")

Kind = Literal["answer", "verdict", "episode"]
KINDS: tuple[str, ...] = ("answer", "verdict", "episode")


@dataclass
class EvalResult:
    version: int
    accuracy: float  # answer: fraction right; verdict: balanced accuracy
    n: int  # problems (answer) or claims (verdict) measured
    seconds: float
    kind: str = "answer"
    #: the other gauges of this evaluation (verdict: eval_right_accuracy, ...)
    extra: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        halves = (f" (right {self.extra['eval_right_accuracy']:.4f}, wrong "
                  f"{self.extra['eval_wrong_accuracy']:.4f})" if self.kind == "verdict" else "")
        x = self.extra
        sampled = (f", {x['eval_k']:.0f} sampled: accuracy {x['eval_sampled_accuracy']:.4f}, "
                   f"pass@k {x['eval_pass_at_k']:.4f}, majority {x['eval_majority_accuracy']:.4f}"
                   if "eval_majority_accuracy" in x else "")
        return (f"version {self.version}: accuracy {self.accuracy:.4f}{halves}{sampled} "
                f"({self.n} {'claims' if self.kind == 'verdict' else 'problems'}, "
                f"{self.seconds:.1f}s)")


def held_out(producer: ProducerConfig, limit: int, out: str | Path = ".") -> list[TaskSpec]:
    """The first ``limit`` held-out problems of the experiment's task source (its test split,
    disjoint from what the producer releases), each prompt as the producer releases it (the
    ``system_prompt`` first), so the model is measured on the format it is trained on."""
    from astraflow.core.errors import ConfigError
    from astraflow.producers import SourceError, held_out_specs, with_system

    try:
        specs = held_out_specs(producer, limit, out)
    except SourceError as e:
        raise ConfigError(f"evaluation needs held-out problems: {e}") from None
    return [replace(spec, prompt=with_system(spec.prompt, producer.system_prompt))
            for spec in specs]


def held_out_claims(producer: ProducerConfig, limit: int, *, prompt: str,
                    seed: int = 0, out: str | Path = ".") -> list[TaskSpec]:
    """Two claims (right, then wrong) for each of the first ``limit`` held-out problems, each
    prompt ``prompt`` formatted as the ``solver_verifier`` workflow formats its verifier's."""
    from astraflow.producers.claims import claim_specs

    return list(claim_specs(held_out(producer, limit, out), prompt=prompt, seed=seed))


def greedy_texts(model: Any, tokenizer: Any, specs: Sequence[TaskSpec], *,
                 max_new_tokens: int, batch_size: int = 256) -> list[str]:
    """The greedy completion of each spec's prompt (rendered as the rollout worker renders
    it), decoded without special tokens."""
    return [row[0] for row in completions(model, tokenizer, specs,
                                          max_new_tokens=max_new_tokens,
                                          batch_size=batch_size)]


def completions(model: Any, tokenizer: Any, specs: Sequence[TaskSpec], *, max_new_tokens: int,
                samples: int = 1, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                batch_size: int = 256) -> list[list[str]]:
    """``samples`` completions of each spec's prompt (rendered as the rollout worker renders
    it), decoded without special tokens: greedy at ``temperature`` 0 (then ``samples`` must
    be 1), else sampled at ``temperature`` and ``top_p`` from a generator seeded with
    ``seed`` (the same draws every evaluation, so versions are compared on equal terms; the
    caller's random state, CPU and CUDA, is left as it was). Generation stops where the
    rollout engines stop (every EOS id of the tokenizer, config and generation config), and
    none of the generation config's other extras (a repetition penalty, top-k) apply: the
    model is measured on the distribution RL samples from."""
    import torch

    from astraflow.consumers.rollout.engines.sampling import eos_ids
    from astraflow.models.prompt import render_prompt

    if samples < 1 or (temperature <= 0 and samples != 1):
        raise ValueError(f"completions: samples >= 1, and 1 when greedy; got samples={samples}"
                         f" temperature={temperature}")
    pad = tokenizer.pad_token_id
    device = next(model.parameters()).device
    stop = sorted(eos_ids(tokenizer, model.config, getattr(model, "generation_config", None)))
    sampled = temperature > 0
    texts: list[list[str]] = []
    per_call = max(1, batch_size // samples)
    plain = {"repetition_penalty": 1.0, "top_k": 0, "pad_token_id": pad,
             "eos_token_id": stop or None}
    kw: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_p": top_p,
         "num_return_sequences": samples} if sampled
        else {"do_sample": False, "temperature": None, "top_p": None})
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if sampled:
            torch.manual_seed(seed)
        for i in range(0, len(specs), per_call):
            chunk = specs[i:i + per_call]
            prompts = [render_prompt(tokenizer, s.prompt)[1] for s in chunk]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
            att = (torch.arange(width, device=device)[None, :] >= torch.tensor(
                [width - len(p) for p in prompts], device=device)[:, None]).long()
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=att, **kw, **plain,
                                     max_new_tokens=max_new_tokens)
            rows = [tokenizer.decode(row, skip_special_tokens=True)
                    for row in out[:, width:].tolist()]
            texts += [rows[j:j + samples] for j in range(0, len(rows), samples)]
    return texts


def greedy_accuracy(model: Any, tokenizer: Any, specs: Sequence[TaskSpec],
                    score: Callable[[str, dict[str, Any]], float], *, max_new_tokens: int,
                    batch_size: int = 256) -> float:
    """Fraction of ``specs`` whose greedy completion scores > 0.5."""
    texts = greedy_texts(model, tokenizer, specs, max_new_tokens=max_new_tokens,
                         batch_size=batch_size)
    right = sum(float(score(t, s.reference)) > 0.5 for t, s in zip(texts, specs, strict=True))
    return right / max(1, len(specs))


@dataclass(frozen=True)
class SampledScore:
    """``k`` sampled completions per problem: the fraction of all samples scored right
    (``accuracy``, what RL's train reward estimates) and of problems with at least one right
    (``pass_at_k``)."""

    accuracy: float
    pass_at_k: float
    k: int
    majority: float | None = None  # maj@k: the problems whose most frequent answer is right


def vote(texts: Sequence[str], key: Callable[[str], str]) -> str:
    """The completion whose answer (``key``, e.g. the reward's extractor) is the most frequent
    of ``texts``; a tie goes to the answer given first, completions without an answer (``""``)
    do not vote (all without one: the first completion)."""
    answers = [key(t) for t in texts]
    counts = Counter(a for a in answers if a)
    if not counts:
        return texts[0]
    best = counts.most_common(1)[0][0]  # ties: insertion order, the first given
    return texts[answers.index(best)]


def sampled_accuracy(model: Any, tokenizer: Any, specs: Sequence[TaskSpec],
                     score: Callable[[str, dict[str, Any]], float], *, k: int,
                     temperature: float, max_new_tokens: int, top_p: float = 1.0,
                     seed: int = 0, batch_size: int = 256,
                     key: Callable[[str], str] | None = None) -> SampledScore:
    """:class:`SampledScore` of ``k`` completions per spec at ``temperature`` and ``top_p``
    (seeded); with ``key`` (the answer a completion gives) also the majority vote of the k
    (:func:`vote`)."""
    rows = completions(model, tokenizer, specs, max_new_tokens=max_new_tokens, samples=k,
                       temperature=temperature, top_p=top_p, seed=seed,
                       batch_size=batch_size)
    right = [[float(score(t, s.reference)) > 0.5 for t in texts]
             for texts, s in zip(rows, specs, strict=True)]
    n = max(1, len(specs))
    majority = None if key is None else sum(
        float(score(vote(texts, key), s.reference)) > 0.5
        for texts, s in zip(rows, specs, strict=True)) / n
    return SampledScore(accuracy=sum(map(sum, right)) / (n * k),
                        pass_at_k=sum(map(any, right)) / n, k=k, majority=majority)


@dataclass(frozen=True)
class VerdictScore:
    """Judgement of a set of claims: accuracy on the right ones (approved), on the wrong ones
    (rejected), their mean, and the fraction of unclear verdicts (wrong on both halves)."""

    right: float
    wrong: float
    unclear: float
    n: int

    @property
    def balanced(self) -> float:
        return (self.right + self.wrong) / 2


def verdict_score(verdicts: Sequence[bool | None], claims: Sequence[TaskSpec]) -> VerdictScore:
    """Score parsed verdicts (True approve, False reject, None unclear) against the claims'
    references (``correct``: "1"/"0"); a half without claims scores 0."""
    hits = {True: [0, 0], False: [0, 0]}  # correct claim? -> [judged right, claims]
    for verdict, claim in zip(verdicts, claims, strict=True):
        correct = str(claim.reference.get("correct")) == "1"
        hits[correct][0] += verdict is correct
        hits[correct][1] += 1
    unclear = sum(v is None for v in verdicts)
    return VerdictScore(right=hits[True][0] / max(1, hits[True][1]),
                        wrong=hits[False][0] / max(1, hits[False][1]),
                        unclear=unclear / max(1, len(claims)), n=len(claims))


def greedy_verdicts(model: Any, tokenizer: Any, claims: Sequence[TaskSpec], *,
                    max_new_tokens: int, batch_size: int = 256) -> VerdictScore:
    """A verifier's greedy judgement of ``claims``, parsed as the workflow parses it."""
    from astraflow.consumers.rollout.workflows.solver_verifier import parse_verdict

    texts = greedy_texts(model, tokenizer, claims, max_new_tokens=max_new_tokens,
                         batch_size=batch_size)
    return verdict_score([parse_verdict(t) for t in texts], claims)


def greedy_episode_accuracy(model: Any, tokenizer: Any, specs: Sequence[TaskSpec], *,
                            policy: str, workflow: str, workflow_kwargs: Mapping[str, Any],
                            reward: RewardConfig, max_new_tokens: int,
                            temperature: float = 0.0) -> float:
    """The ``episode`` kind's measure: ``workflow`` run greedily (or at ``temperature``, from
    the same seed every time) on ``specs`` by ``model`` (in an ``hf`` engine sharing its
    weights), the fraction of episodes ending right."""
    from astraflow.consumers.episodes import episode_accuracy
    from astraflow.consumers.rollout.engines.hf import HFEngine

    engine = HFEngine(model=model, tokenizer=tokenizer, max_batch_size=max(1, len(specs)))
    return episode_accuracy({policy: engine}, specs, workflow=workflow, reward=reward.name,
                            reward_kwargs=reward.kwargs, extract=reward.extract,
                            workflow_kwargs=workflow_kwargs,
                            max_new_tokens=max_new_tokens, temperature=temperature)


#: a version left alone this many times the pace of versions (and at least ``idle_s``) is
#: taken as a run's last (:class:`VersionWatch`); `astraflow run` waits for it accordingly
IDLE_PACE = 3.0


class VersionWatch:
    """When an evaluator following one or several policies' versions is due: when some
    policy's newest version is ``every`` past the last evaluated one, or newer than it and not
    followed by another for a while (so a run's final versions are always evaluated). Pure:
    feed it versions and a clock.

    "A while" is ``idle_s`` seconds or ``pace`` times the seconds a version has been taking
    (a moving mean over the versions seen), whichever is longer: a trainer whose steps take
    longer than ``idle_s`` (any real model; a small one on a busy host) would otherwise leave
    every version "idle" and have each one evaluated, ``every`` ignored. Measured on
    examples/agent_tools.yaml on Kafka (~4 s a step, ``every`` 10): 58 evaluations in 80
    steps, each taking the cores from rollout."""

    def __init__(self, policies: Sequence[str], *, every: int = 1, idle_s: float = 2.0,
                 pace: float = IDLE_PACE, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if every < 1 or idle_s < 0 or pace < 0:
            raise ValueError(f"VersionWatch: every >= 1, idle_s >= 0 and pace >= 0; got "
                             f"every={every} idle_s={idle_s} pace={pace}")
        self.every, self.idle_s, self.pace, self.clock = every, idle_s, pace, clock
        self.last = {p: 0 for p in policies}
        self.newest = dict(self.last)
        self.newest_at = clock()
        # moving mean of the seconds a version takes; the first is timed from the watch's
        # start, which makes the pace slow at first rather than unknown (an unknown pace
        # would take version 1 as idle and evaluate it)
        self.per_version: float | None = None

    def seen(self, policy: str, version: int | None) -> None:
        if version is not None and version > self.newest[policy]:
            now = self.clock()
            # versions reached in one sync after a pause (an evaluation) share its time
            gap = (now - self.newest_at) / (version - self.newest[policy])
            self.per_version = (gap if self.per_version is None
                                else 0.7 * self.per_version + 0.3 * gap)
            self.newest[policy] = version
            self.newest_at = now

    @property
    def idle_after(self) -> float:
        """Seconds the newest version must be left alone to count as a run's last."""
        if self.per_version is None:
            return self.idle_s
        return max(self.idle_s, self.pace * self.per_version)

    def due(self) -> bool:
        ahead = [self.newest[p] - self.last[p] for p in self.newest]
        return any(d >= self.every for d in ahead) or (
            any(d > 0 for d in ahead) and self.clock() - self.newest_at >= self.idle_after)

    def take(self) -> dict[str, int]:
        """The versions to evaluate now (and mark them evaluated)."""
        self.last = dict(self.newest)
        return dict(self.newest)


def follow(bus: Any, *, dlq: str, component: str, watch: VersionWatch,
           syncers: Mapping[str, Any], evaluate: Callable[[dict[str, int]], Any],
           done: Callable[[], bool], idle: Callable[[], None], timeout: float | None,
           should_stop: Callable[[], bool]) -> None:
    """Follow ``syncers`` (policy -> weights syncer) and ``evaluate`` the versions reached
    whenever ``watch`` says so, until ``done()``, ``timeout`` or ``should_stop()``. A handler
    without inputs on the processor runtime, which owns stopping (each syncer reads its own
    ``weights.<policy>``)."""
    from astraflow.core.stream import Processor, Stateless

    wait = 0.5 / max(1, len(syncers))

    from astraflow.core.errors import BusError, WeightStoreError

    def tick() -> list[Any]:
        for policy, syncer in syncers.items():
            try:
                version = syncer.sync_once(timeout=wait)
            except (BusError, WeightStoreError) as e:
                # a cut link or a broker restart: the sync resumes at the next tick, rather
                # than the evaluator exiting (and the supervisor restarting it from nothing)
                log.warning("weight sync failed policy=%s (retried): %s", policy, e)
                continue
            watch.seen(policy, version)
        if watch.due():
            evaluate(watch.take())
        else:
            idle()
        return []

    proc = Processor(bus, Stateless(tick=tick, done=done), [], dlq=dlq, component=component)
    try:
        proc.run(timeout=timeout, should_stop=should_stop)
    finally:
        proc.close()


class Evaluator:
    """Greedy held-out accuracy (``kind="answer"``) or judgement (``kind="verdict"``, claims
    prompted with ``verifier_prompt``) of every weight version of ``policy`` it can reach."""

    def __init__(self, *, run: str, policy: str, model: ModelConfig, producer: ProducerConfig,
                 reward: RewardConfig, max_new_tokens: int, weights: WeightsConfig,
                 out: str | Path, bus: Any, limit: int = 500, metrics: Any = None,
                 component: str | None = None, kind: str = "answer",
                 verifier_prompt: str | None = None, seed: int = 0,
                 workflow: str = "single_turn",
                 workflow_kwargs: Mapping[str, Any] | None = None,
                 temperature: float = 0.0, samples: int = 0,
                 sample_temperature: float = 1.0, sample_top_p: float = 1.0,
                 device: str = "cpu") -> None:
        from astraflow.consumers.rollout.engines.target import ModelTarget
        from astraflow.consumers.rollout.rewards import EXTRACTORS, build_reward
        from astraflow.core.errors import ConfigError
        from astraflow.core.metrics import component_id
        from astraflow.core.topics import topic_name
        from astraflow.models.config import model_dir
        from astraflow.models.tiny import load
        from astraflow.weights.config import build_syncer

        if kind not in KINDS:
            raise ConfigError(f"unknown evaluation kind {kind!r}; valid: {', '.join(KINDS)}")
        self.policy = policy
        self.kind = kind
        self.metrics = metrics
        self.bus = bus
        self.dlq = topic_name(run, "dlq")
        # unique per process: two evaluators of one policy must not share a label
        self.component = component or (metrics.component if metrics is not None
                                       else component_id(f"evaluator-{policy}"))
        self.model, self.tokenizer = load(model_dir(model, policy, out), device=device)
        self.model.eval()
        if kind == "verdict":
            from astraflow.consumers.rollout.workflows.solver_verifier import VERIFIER_PROMPT

            self.specs = held_out_claims(producer, limit, prompt=verifier_prompt or
                                         VERIFIER_PROMPT, seed=seed, out=out)
        else:
            self.specs = held_out(producer, limit, out)
        self.reward = build_reward(reward)
        extract = reward.extract if reward.extract != "none" else "last_line"
        self.answer_of = EXTRACTORS.resolve(extract)  # what a majority vote counts
        # answer kind: also ``samples`` completions per problem at ``sample_temperature``
        # (pass@k and the sampled accuracy RL's train reward estimates); 0: greedy only
        if samples and sample_temperature <= 0:
            raise ConfigError("launch.eval_samples samples at rollout.engine.temperature, which "
                              "is 0 (greedy): set a temperature, or eval_samples: 0")
        self.samples, self.sample_temperature, self.seed = samples, sample_temperature, seed
        self.sample_top_p = sample_top_p
        self.reward_config = reward
        self.workflow, self.workflow_kwargs = workflow, dict(workflow_kwargs or {})
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        from astraflow.weights.adapter import merging_target

        self.target = merging_target(self.model, ModelTarget(self.model))  # LoRA: merged
        self.syncer = build_syncer(bus, weights, self.target, run=run, policy=policy,
                                   worker="evaluator", out=out)
        self.results: list[EvalResult] = []

    def measure(self) -> tuple[float, dict[str, float]]:
        """(eval_accuracy, the other gauges) of the weights the model holds now."""
        if self.kind == "verdict":
            v = greedy_verdicts(self.model, self.tokenizer, self.specs,
                                max_new_tokens=self.max_new_tokens)
            return v.balanced, {"eval_right_accuracy": v.right, "eval_wrong_accuracy": v.wrong,
                                "eval_unclear": v.unclear}
        if self.kind == "episode":
            return greedy_episode_accuracy(
                self.model, self.tokenizer, self.specs, policy=self.policy,
                workflow=self.workflow, workflow_kwargs=self.workflow_kwargs,
                reward=self.reward_config, max_new_tokens=self.max_new_tokens,
                temperature=self.temperature), {"eval_temperature": self.temperature}
        greedy = greedy_accuracy(self.model, self.tokenizer, self.specs, self._score,
                                 max_new_tokens=self.max_new_tokens)
        if not self.samples:
            return greedy, {}
        s = sampled_accuracy(self.model, self.tokenizer, self.specs, self._score,
                             k=self.samples, temperature=self.sample_temperature,
                             top_p=self.sample_top_p, max_new_tokens=self.max_new_tokens,
                             seed=self.seed, key=self.answer_of)
        return greedy, {"eval_sampled_accuracy": s.accuracy, "eval_pass_at_k": s.pass_at_k,
                        "eval_majority_accuracy": s.majority or 0.0, "eval_k": float(s.k)}

    def evaluate(self, version: int) -> EvalResult:
        t0 = time.monotonic()
        acc, extra = self.measure()
        res = EvalResult(version, acc, len(self.specs), time.monotonic() - t0, self.kind, extra)
        self.results.append(res)
        log.info("eval policy=%s kind=%s version=%d accuracy=%.4f n=%d seconds=%.1f%s",
                 self.policy, self.kind, version, acc, res.n, res.seconds,
                 "".join(f" {k}={v:.4f}" for k, v in extra.items()))
        if self.metrics is not None:
            self.metrics.set("eval_step", version)
            self.metrics.set("eval_accuracy", acc)
            for k, v in extra.items():
                self.metrics.set(k, v)
            self.metrics.set("weight_version", version)
            self.metrics.inc("evaluations")
            self.metrics.inc("time.evaluate_s", res.seconds)  # where its time goes
            self.metrics.emit()
        return res

    def _score(self, text: str, reference: dict[str, Any]) -> float:
        return float(self.reward(text, reference))

    def run(self, *, max_evals: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] = lambda: False, initial: bool = True,
            every: int = 1, idle_s: float = 2.0) -> None:
        """Evaluate the initial weights (as version 0), then a version whenever ``every``
        versions passed since the last evaluation — or when the newest version reached has
        not been followed by another for ``idle_s`` seconds or three times the pace of
        versions, whichever is longer (:class:`VersionWatch`; so the final version of a run
        is always evaluated) — until stopped (:func:`follow`)."""
        if initial:
            self.evaluate(0)
        follow(self.bus, dlq=self.dlq, component=self.component,
               watch=VersionWatch([self.policy], every=every, idle_s=idle_s),
               syncers={self.policy: self.syncer},
               evaluate=lambda versions: self.evaluate(versions[self.policy]),
               done=lambda: max_evals is not None and len(self.results) >= max_evals,
               idle=self.metrics.tick if self.metrics is not None else lambda: None,
               timeout=timeout, should_stop=should_stop)

    def close(self) -> None:
        self.syncer.close()
