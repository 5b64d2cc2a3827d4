"""Reads the run's ``metrics`` topic: the newest snapshot of every process, rates, and the
lines of ``metrics.jsonl``.

``metrics.jsonl`` has one JSON object per line. Every line has ``time`` (seconds since the
epoch), ``elapsed`` (seconds since the collector started) and ``step`` (the trainer's step);
trainer lines carry the trainer's gauges (``loss``, ``reward_mean``, ``wait_ratio``, ...),
evaluation lines carry ``eval_accuracy`` (held-out greedy accuracy, 0..1), rollout summary
lines carry ``episodes_per_s`` and ``gen_tokens_per_s`` (tokens generated per second).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from astraflow.core.bus.types import Bus
from astraflow.core.errors import SchemaError
from astraflow.core.records import Metric, decode
from astraflow.core.topics import topic_name


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
    components: dict[str, ComponentState] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    lines: int = 0
    _fh: IO[str] | None = None
    _last_step: dict[str, float] = field(default_factory=dict)
    _last_eval: dict[str, float] = field(default_factory=dict)

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
            self._take(m)  # type: ignore[arg-type]
            n += 1
        if self._fh is not None and n:
            self._fh.flush()
        return n

    def _take(self, m: Metric) -> None:
        st = self.components.get(m.component)
        if st is None:
            self.components[m.component] = ComponentState(m, time.time())
        else:
            st.prev, st.metric = st.metric, m
        if self._fh is None:
            return
        step = m.gauges.get("step")
        if m.role == "trainer" and step is not None and step != self._last_step.get(m.component):
            self._last_step[m.component] = step
            self._write({"source": m.component, "step": int(step), **m.gauges,
                         **{f"{k}_total": v for k, v in m.counters.items()}}, m.ts)
        acc = m.gauges.get("eval_accuracy")
        eval_step = m.gauges.get("eval_step", step)
        if m.role == "evaluator" and acc is not None and eval_step is not None and \
                self._last_eval.get(m.component) != eval_step:
            self._last_eval[m.component] = eval_step
            self._write({"source": m.component, "step": int(eval_step),
                         "eval_accuracy": acc}, m.ts)

    def _write(self, obj: dict[str, Any], ts: float) -> None:
        assert self._fh is not None
        line = {"time": ts, "elapsed": round(ts - self.started, 3), **obj}
        self._fh.write(json.dumps(line) + "\n")
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

    def trainer_step(self) -> int:
        return int(max((c.metric.gauges.get("step", 0) for c in self.by_role("trainer")),
                       default=0))

    def write_summary(self) -> None:
        """Append a rollout-throughput line (the supervisor calls this every few seconds)."""
        if self._fh is None:
            return
        eps, tps = self.rollout_rates()
        self._write({"source": "rollout", "step": self.trainer_step(),
                     "episodes_per_s": round(eps, 3), "gen_tokens_per_s": round(tps, 1),
                     "rollout_workers": len([c for c in self.by_role("rollout")
                                             if c.metric.status == "running"])}, time.time())
        self._fh.flush()

    def close(self) -> None:
        self._reader.close()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
