"""The scaler (`astraflow scale`): consumes ``reports`` as the run's ``scaler`` group, decides
each pool's size by :class:`~astraflow.consumers.scaler.rule.Rule`, and asks the pool's
actuator for it.

A report that does not decode, or whose handling raises, is dead-lettered and the scaler goes
on; an actuator's failure comes back as an
:class:`~astraflow.consumers.scaler.actuators.Actuation`, logged and counted
(``actuation_failures``). Every decision is one JSON line in ``log_path`` and gauges on
``metrics`` (docs/elastic.md#the-rule).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from astraflow.consumers.scaler.actuation import Actuator
from astraflow.consumers.scaler.config import ScaleConfig
from astraflow.consumers.scaler.rule import Decision, Rule
from astraflow.core.bus.types import Bus, Message
from astraflow.core.jsonl import json_line
from astraflow.core.metrics import MetricsEmitter
from astraflow.core.records import LoadReport, decode
from astraflow.core.stream import Input, Output, Processor, Stateless
from astraflow.core.topics import group_name, topic_name

log = logging.getLogger("astraflow.scaler")


class Scaler:
    """The handler: one :class:`Rule` and one actuator per pool."""

    def __init__(self, config: ScaleConfig, actuators: Mapping[str, Actuator], *,
                 batch_groups: Mapping[str, int] | None = None,
                 metrics: MetricsEmitter | None = None, log_path: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        missing = sorted(set(config.pools) - set(actuators))
        if missing:
            raise ValueError(f"no actuator for pool(s) {', '.join(missing)}")
        batch_groups = batch_groups or {}
        self.rules = {name: Rule(config, name, pool, batch_groups.get(name, 1))
                      for name, pool in config.pools.items()}
        self.actuators = dict(actuators)
        self.metrics = metrics
        self.clock = clock
        self.decisions: list[dict[str, Any]] = []
        self.log_path = log_path
        self._file: IO[str] | None = None

    def handle(self, report: LoadReport, _msg: Message | None = None) -> Iterable[Output]:
        for name, rule in self.rules.items():
            act = self.actuators[name]
            known = act.count()
            decision = rule.decide(report, self.clock(), known)
            self._apply(decision, act, report)
        return ()

    def _apply(self, d: Decision, act: Actuator, report: LoadReport) -> None:
        line: dict[str, Any] = {**d.as_dict(), "report_seq": report.seq}
        if d.target != d.current:
            outcome = act.scale(d.target, d.current)
            line["actuation"] = outcome.as_dict()
            if not outcome.ok:
                self._count("actuation_failures")
                log.error("pool=%s scale %d -> %d failed after %d attempt(s): %s", d.pool,
                          d.current, d.target, outcome.attempts, outcome.error)
            else:
                self._count(f"scaled_{d.action}")
        log.info("pool=%s zone=%s current=%d wanted=%d target=%d w=%.3f useful_lag=%d "
                 "reason=%s", d.pool, d.zone, d.current, d.wanted, d.target, d.inputs["w"],
                 int(d.inputs["useful_lag"]), d.reason)
        self.decisions.append(line)
        self._write(line)
        if self.metrics is not None:
            for k, v in (("current", d.current), ("target", d.target),
                         ("w", d.inputs["w"]), ("useful_lag", d.inputs["useful_lag"])):
                self.metrics.set(f"pool.{d.pool}.{k}", float(v))
            self.metrics.inc("decisions")
            self.metrics.emit()

    def _count(self, name: str) -> None:
        if self.metrics is not None:
            self.metrics.inc(name)

    def _write(self, line: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        if self._file is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.log_path.open("a")
        self._file.write(json_line(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _decode_report(msg: Message) -> LoadReport:
    return decode(msg.value, LoadReport)


def scaler_processor(bus: Bus, scaler: Scaler, *, run: str, component: str = "scaler",
                     poll_timeout: float = 0.5) -> Processor:
    """The processor that feeds ``reports`` to ``scaler`` (``run`` it as often as wanted;
    `astraflow run` calls it between its own ticks). A report that does not decode, or whose
    handling raises, goes to ``dlq``."""
    return Processor(bus, Stateless(), [Input([topic_name(run, "reports")],
                                              group_name(run, "scaler"), _decode_report,
                                              scaler.handle)],
                     dlq=topic_name(run, "dlq"), component=component, cycle_interval=0.0,
                     poll_timeout=poll_timeout, label=f"{component} ")
