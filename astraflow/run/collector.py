"""Reads the run's ``metrics`` topic: the newest snapshot of every process, rates, and the
lines of ``metrics.jsonl``.

Every line of ``metrics.jsonl`` is one JSON object with ``time`` (seconds since the epoch),
``elapsed`` (seconds since the collector started) and ``step`` (the trainer's step); trainer
lines carry the trainer's gauges, rollout summary lines the rates, evaluation lines their
``policy`` and ``kind`` (docs/evaluation.md). A process's policy comes from its component id,
``<role>-<policy>-<host>-<pid>-<hex>``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from astraflow.core.bus.types import Bus
from astraflow.core.errors import SchemaError
from astraflow.core.jsonl import json_line
from astraflow.core.metrics import named_policy
from astraflow.core.records import Metric, decode
from astraflow.core.topics import topic_name

#: the gauges of a verifier's evaluation besides eval_accuracy (their presence: kind verdict)
VERDICT_GAUGES = ("eval_right_accuracy", "eval_wrong_accuracy", "eval_unclear")
#: the gauges of an answer evaluation with sampled completions (launch.eval_samples)
SAMPLED_GAUGES = ("eval_sampled_accuracy", "eval_pass_at_k", "eval_majority_accuracy", "eval_k")
#: the gauges of the team's evaluation
SYSTEM_GAUGES = ("system_accuracy", "first_accuracy", "retry_rate", "unclear_rate", "error_rate")
TEAM = "team"  # the policy field of the team's evaluation lines
TEAM_ROLE = "evaluator-team"  # the Metric role of the team's evaluator


def eval_kind(gauges: dict[str, float]) -> str:
    """``system``, ``verdict``, ``episode`` or ``answer``: what an evaluator's gauges measure
    (an ``episode`` evaluator reports the temperature its episodes ran at)."""
    if "system_accuracy" in gauges:
        return "system"
    if "eval_temperature" in gauges:
        return "episode"
    return "verdict" if "eval_right_accuracy" in gauges else "answer"


@dataclass
class ComponentState:
    metric: Metric
    first_seen: float
    prev: Metric | None = None

    def rate(self, counter: str) -> float:
        """Per-second rate of ``counter`` between the last two snapshots."""
        if self.prev is None:
            return 0.0
        dt = self.metric.ts - self.prev.ts
        if dt <= 0:
            return 0.0
        return (self.metric.counters.get(counter, 0.0) - self.prev.counters.get(counter, 0.0)) / dt


@dataclass
class Collector:
    """Follows ``metrics`` of one run. ``poll()`` reads what is new; ``components`` holds the
    newest snapshot per process; with ``jsonl`` it appends metrics.jsonl lines."""

    bus: Bus
    run: str
    jsonl: Path | None = None
    #: the run's policies: a trainer or evaluator whose id names none is the only policy's
    policies: Sequence[str] = ()
    #: the task the evaluators measure (written on every evaluation line); None: not written
    task: str | None = None
    #: where every line also goes (metrics.sinks, :mod:`astraflow.run.sinks`); closed by close()
    sinks: Sequence[Any] = ()
    components: dict[str, ComponentState] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    lines: int = 0
    _fh: IO[str] | None = None
    _last_step: dict[str, float] = field(default_factory=dict)
    _last_eval: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.topic = topic_name(self.run, "metrics")
        # A group-less reader: every collector sees every snapshot, and leaves nothing behind.
        self._reader = self.bus.reader(self.topic, start="earliest", client_id="collector")
        if self.jsonl is not None:
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.jsonl.open("a")

    def poll(self, timeout: float = 0.0) -> int:
        n = 0
        for msg in self._reader.consume(1000, timeout):
            try:
                m = decode(msg.value, Metric)
            except SchemaError:
                continue
            self._take(m)
            n += 1
        if self._fh is not None and n:
            self._fh.flush()
        return n

    def catch_up(self, timeout: float = 30.0) -> int:
        """Read every snapshot on the topic now (not those that arrive meanwhile: a live run
        always has more), for at most ``timeout`` seconds; returns how many were read."""
        ends = self.bus.describe_topic(self.topic).end_offsets
        deadline = time.monotonic() + timeout
        n = 0
        while (any(self._reader.position(p) < end for p, end in ends.items())
               and time.monotonic() < deadline):
            n += self.poll(0.2)
        return n

    def _take(self, m: Metric) -> None:
        st = self.components.get(m.component)
        if st is None:
            self.components[m.component] = ComponentState(m, time.time())
        else:
            st.prev, st.metric = st.metric, m
        if self._fh is None and not self.sinks:
            return
        step = m.gauges.get("step")
        if m.role == "trainer" and step is not None and step != self._last_step.get(m.component):
            self._last_step[m.component] = step
            who = self.policy_of(m)
            self._write({"source": m.component, "step": int(step),
                         **({"policy": who} if who is not None else {}), **m.gauges,
                         **{f"{k}_total": v for k, v in m.counters.items()}}, m.ts)
        if m.role == "evaluator":
            self._eval_line(m, step)
        elif m.role == TEAM_ROLE:
            self._team_line(m)

    def _eval_line(self, m: Metric, step: float | None) -> None:
        acc = m.gauges.get("eval_accuracy")
        eval_step = m.gauges.get("eval_step", step)
        if acc is None or eval_step is None or self._last_eval.get(m.component) == eval_step:
            return
        self._last_eval[m.component] = eval_step
        kind = eval_kind(m.gauges)
        extra = {k: m.gauges[k] for k in (VERDICT_GAUGES if kind == "verdict" else
                                          ("eval_temperature", *SAMPLED_GAUGES))
                 if k in m.gauges}
        self._write({"source": m.component, "step": int(eval_step),
                     "policy": self.policy_of(m), "kind": kind,
                     **({"task": self.task} if self.task is not None else {}),
                     "eval_accuracy": acc, **extra}, m.ts)

    def _team_line(self, m: Metric) -> None:
        if "system_accuracy" not in m.gauges:
            return
        versions = {k.removeprefix("version."): int(v) for k, v in m.gauges.items()
                    if k.startswith("version.")}
        key = (m.counters.get("evaluations"), tuple(sorted(versions.items())))
        if self._last_eval.get(m.component) == key:
            return
        self._last_eval[m.component] = key
        self._write({"source": m.component, "step": int(m.gauges.get("eval_step", 0)),
                     "policy": TEAM, "kind": "system",
                     **{k: m.gauges[k] for k in SYSTEM_GAUGES if k in m.gauges},
                     "versions": versions}, m.ts)

    def policy_of(self, m: Metric) -> str | None:
        """The policy of a trainer or evaluator: the one its component id names, else the
        run's only policy, else None."""
        named = named_policy(m)
        if named is not None and (not self.policies or named in self.policies):
            return named
        return self.policies[0] if len(self.policies) == 1 else named

    def _write(self, obj: dict[str, Any], ts: float) -> None:
        line = {"time": ts, "elapsed": round(ts - self.started, 3), **obj}
        if self._fh is not None:
            self._fh.write(json_line(line) + "\n")
        if self.sinks:
            from astraflow.run.sinks import scalars

            step, values = scalars(line)
            for sink in self.sinks:
                sink.write(values, step, ts)
        self.lines += 1

    # -- summaries for the live view and the plots -------------------------------------------
    def by_role(self, role: str) -> list[ComponentState]:
        return [c for c in self.components.values() if c.metric.role == role]

    def rollout_rates(self) -> tuple[float, float]:
        """(episodes/s, tokens/s) summed over live rollout workers."""
        now = time.time()
        live = [c for c in self.by_role("rollout")
                if c.metric.status == "running" and now - c.metric.ts < 30]
        return (sum(c.rate("episodes") for c in live), sum(c.rate("tokens") for c in live))

    def trainer_step(self, policy: str | None = None) -> int:
        """The newest trainer step (of ``policy``'s trainer; None: of any)."""
        trainers = self.by_role("trainer")
        if policy is not None:
            trainers = [c for c in trainers if self.policy_of(c.metric) == policy]
        return int(max((c.metric.gauges.get("step", 0) for c in trainers), default=0))

    def newest_by_policy(self, role: str) -> dict[str | None, ComponentState]:
        """Per policy, the process of ``role`` heard from last (a restarted role leaves its
        old component behind)."""
        out: dict[str | None, ComponentState] = {}
        for c in self.by_role(role):
            p = self.policy_of(c.metric)
            if p not in out or c.metric.ts >= out[p].metric.ts:
                out[p] = c
        return out

    def evaluators(self) -> dict[str | None, ComponentState]:
        """Each policy's evaluator (the newest process of each)."""
        return self.newest_by_policy("evaluator")

    def team_evaluator(self) -> ComponentState | None:
        evs = self.by_role(TEAM_ROLE)
        return max(evs, key=lambda c: c.metric.ts) if evs else None

    def write_summary(self, lags: dict[str, int] | None = None) -> None:
        """Append a rollout line (the supervisor calls this every few seconds): throughput,
        workers, episodes in flight, the oldest weight version in use and, given ``lags``
        (label -> records), each group's bus lag as ``lag.<label>``."""
        if self._fh is None and not self.sinks:
            return
        eps, tps = self.rollout_rates()
        running = [c for c in self.by_role("rollout") if c.metric.status == "running"]
        versions = [c.metric.gauges["weight_version"] for c in running
                    if "weight_version" in c.metric.gauges]
        self._write({"source": "rollout", "step": self.trainer_step(),
                     "episodes_per_s": round(eps, 3), "gen_tokens_per_s": round(tps, 1),
                     "rollout_workers": len(running),
                     "inflight": sum(c.metric.gauges.get("inflight", 0) for c in running),
                     **({"weight_version_min": min(versions)} if versions else {}),
                     **{f"lag.{k.replace('→', '_to_')}": v for k, v in (lags or {}).items()}},
                    time.time())
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        self._reader.close()
        for sink in self.sinks:
            sink.close()
        self.sinks = ()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
