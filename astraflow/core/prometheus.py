"""A Prometheus endpoint per process, exporting a :class:`MetricsEmitter`'s counters and gauges.

Names are ``astraflow_<name>_total`` for counters and ``astraflow_<name>`` for gauges, with
labels ``run``, ``role`` and ``component`` (the process labels its own series with its run, so
any Prometheus that scrapes several runs, or a compose stack, can tell them apart without
scrape-side relabelling). The port comes from ``ASTRAFLOW_METRICS_PORT`` (or the
caller); 0 picks a free port, which the emitter reports as the gauge ``prometheus_port`` so
``astraflow top`` and the run directory can tell where to scrape.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from astraflow.core.metrics import PORT_ENV

if TYPE_CHECKING:
    from astraflow.core.metrics import MetricsEmitter

log = logging.getLogger("astraflow.prometheus")
_BAD = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(name: str) -> str:
    """``"tokens/s"`` → ``"tokens_s"``: a valid Prometheus name part."""
    clean = _BAD.sub("_", name).strip("_") or "unnamed"
    return clean if not clean[0].isdigit() else f"_{clean}"


class _Collector:
    def __init__(self, emitter: MetricsEmitter) -> None:
        self.emitter = emitter

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = ["run", "role", "component"]
        values = [self.emitter.run, self.emitter.role, self.emitter.component]
        counters, gauges = self.emitter.snapshot()
        for name, v in sorted(counters.items()):
            fam = CounterMetricFamily(f"astraflow_{metric_name(name)}", name, labels=labels)
            fam.add_metric(values, v)
            yield fam
        for name, v in sorted(gauges.items()):
            gauge = GaugeMetricFamily(f"astraflow_{metric_name(name)}", name, labels=labels)
            gauge.add_metric(values, v)
            yield gauge


def serve(emitter: MetricsEmitter, port: int | None = None, addr: str = "0.0.0.0") -> int | None:
    """Start the endpoint in a daemon thread; return its port (None when disabled: no port
    given and ``ASTRAFLOW_METRICS_PORT`` unset)."""
    if port is None:
        env = os.environ.get(PORT_ENV)
        if env is None or env == "":
            return None
        port = int(env)
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(emitter))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    bound = int(server.server_port)
    emitter.set("prometheus_port", bound)
    log.info("prometheus endpoint component=%s port=%d", emitter.component, bound)
    return bound
