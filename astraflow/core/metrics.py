"""Heartbeats and metrics: every process emits :class:`Metric` records to ``metrics``.

>>> m = MetricsEmitter(bus, run="r", role="rollout")
>>> m.inc("episodes"); m.set("inflight", 3)
>>> m.tick()              # emits at most every ``interval`` seconds (also a heartbeat)
>>> m.close("stopped")

Counters only grow from process start; gauges are current values. Readers (the reporter,
``astraflow top``) key by ``component``. With ``ASTRAFLOW_METRICS_PORT`` set, the first emitter
of a process also serves them on a Prometheus endpoint (0: any free port).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from astraflow.core.bus.types import Bus
from astraflow.core.errors import BusError
from astraflow.core.records import Metric
from astraflow.core.stream import Output, send
from astraflow.core.topics import record_key, topic_name

log = logging.getLogger("astraflow.metrics")
PORT_ENV = "ASTRAFLOW_METRICS_PORT"
_serving = False


def component_id(role: str) -> str:
    """A unique, readable id for this process: ``<role>-<host>-<pid>-<4 hex>``."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def label(m: Metric) -> str:
    """The component id without its process suffix (``-<host>-<pid>-<hex>``): e.g.
    ``evaluator-solver``; the whole id when it has no such suffix."""
    cut = m.component.find(f"-{m.host}-{m.pid}-")
    return m.component if cut < 0 else m.component[:cut]


def named_policy(m: Metric) -> str | None:
    """The policy a trainer's or evaluator's component id names (``trainer-<policy>-...``,
    ``evaluator-<policy>-...``), or None."""
    name = label(m)
    for prefix in ("evaluator-", "trainer-"):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix):]
    return None


def process_age() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere): a role's wall
    time, of which its ``time.<phase>_s`` counters say where it went."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class MetricsEmitter:
    """Counts and gauges for one process, sent to the run's ``metrics`` topic."""

    def __init__(self, bus: Bus, *, run: str, role: str, component: str | None = None,
                 interval: float = 2.0) -> None:
        self.run = run
        self.role = role
        self.component = component or component_id(role)
        self.interval = interval
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self._topic = topic_name(run, "metrics")
        self._producer = bus.producer(client_id=self.component)
        self._last: float | None = None
        self._lock = threading.Lock()
        self._host = socket.gethostname()
        global _serving
        if not _serving and os.environ.get(PORT_ENV):
            # One endpoint per process: the first emitter created serves it.
            _serving = True
            try:
                self.serve_prometheus()
            except OSError as e:  # metrics never stop the work: say so once and go on
                log.warning("prometheus endpoint not served component=%s %s=%s error=%s; "
                            "give each process its own port (or 0: any free port)",
                            self.component, PORT_ENV, os.environ.get(PORT_ENV), e)

    def inc(self, name: str, n: float = 1.0) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0.0) + n

    def set_total(self, name: str, total: float) -> None:
        """Set a counter to ``total`` (for counts kept elsewhere, e.g. checkpointed state)."""
        with self._lock:
            self.counters[name] = float(total)

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = float(value)

    def snapshot(self) -> tuple[dict[str, float], dict[str, float]]:
        """Copies of the counters and gauges, taken atomically."""
        with self._lock:
            return dict(self.counters), dict(self.gauges)

    def serve_prometheus(self, port: int | None = None) -> int | None:
        """Expose these metrics on a Prometheus endpoint (see :mod:`astraflow.core.prometheus`)."""
        from astraflow.core.prometheus import serve

        return serve(self, port)

    def tick(self, status: str = "running") -> bool:
        """Emit if ``interval`` passed since the last emission. Returns whether it emitted."""
        if self._last is not None and time.monotonic() - self._last < self.interval:
            return False
        self.emit(status)
        return True

    def emit(self, status: str = "running") -> None:
        """Emit now. A bus failure is logged, not raised: metrics never stop the work."""
        age = process_age()
        with self._lock:
            if age is not None:
                self.counters["time.alive_s"] = age
            rec = Metric(component=self.component, role=self.role, host=self._host,
                         pid=os.getpid(), status=status,  # type: ignore[arg-type]
                         counters=dict(self.counters), gauges=dict(self.gauges))
        self._last = time.monotonic()
        try:
            send(self._producer, Output(self._topic, rec, record_key("metrics", rec)))
            self._producer.flush()
        except BusError as e:
            log.warning("metrics not emitted component=%s error=%s", self.component, e)

    def close(self, status: str = "stopped") -> None:
        self.emit(status)
        self._producer.close()
