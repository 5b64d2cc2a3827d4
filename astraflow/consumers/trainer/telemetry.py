"""What the trainer reports: the wait ratio, the per-step JSON lines, metrics on the bus.

``wait_ratio`` is ``Σ wait / (Σ wait + Σ busy)`` over recent steps plus the wait still open, so a
starved trainer's ratio climbs towards 1 between steps; *waiting* is time blocked in the bus
poll, *busy* the step, hand-off and checkpoints. The scaler reads it as ``w``
(docs/elastic.md#the-rule).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from astraflow.core.jsonl import json_line
from astraflow.core.metrics import MetricsEmitter

#: step metrics also sent as gauges on the metrics topic
GAUGES = ("loss", "reward_mean", "wait_ratio", "train_tokens_per_s", "grad_norm", "kl", "entropy",
          "clip_frac", "lr", "staleness_mean", "adv_abs_mean", "adv_std",
          "mismatch_k3_fresh", "mismatch_k3_stale", "mismatch_abs_max_fresh",
          "mismatch_abs_p99_fresh", "mismatch_beyond_fresh", "mismatch_alarm")


class Telemetry:
    """Counters (checkpointed with the trainer), the wait window, the JSON-lines log."""

    def __init__(self, *, metrics: MetricsEmitter | None, log_path: Path | None,
                 window: int = 20) -> None:
        self.metrics = metrics
        self.log_path = log_path
        self.counters: dict[str, float] = {}
        self._window: deque[tuple[float, float]] = deque(maxlen=window)
        self._open_wait = 0.0
        self._file: Any = None

    def open(self) -> None:
        if self.log_path is not None and self._file is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.log_path, "a")  # noqa: SIM115 - closed in close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def inc(self, name: str, n: float = 1.0) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + n
        if self.metrics is not None:
            self.metrics.inc(name, n)

    def waited(self, seconds: float) -> None:
        self._open_wait += seconds
        self.inc("wait_s", seconds)
        self.phase("wait", seconds)

    def phase(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to the time spent in ``name`` (``time.<name>_s``: where every
        second of the role goes, summed per role in the run's summary)."""
        self.inc(f"time.{name}_s", seconds)

    def wait_ratio(self) -> float:
        wait = sum(w for w, _ in self._window) + self._open_wait
        busy = sum(b for _, b in self._window)
        return wait / max(wait + busy, 1e-9)

    def step(self, record: dict[str, Any], busy: float) -> dict[str, Any]:
        """Close the step's wait, add timing fields to ``record``, log and report it."""
        self._window.append((self._open_wait, busy))
        record["wait_s"], record["busy_s"] = self._open_wait, busy
        record["wait_ratio"] = self.wait_ratio()
        self._open_wait = 0.0
        self.log(record)
        self.inc("steps")
        self.inc("busy_s", busy)
        for k in ("tokens", "trajectories"):
            self.inc(k, float(record.get(k, 0.0)))
        if self.metrics is not None:
            self.metrics.set("version", record["step"])
            self.metrics.set("step", record["step"])
            for k in GAUGES:
                if k in record:
                    self.metrics.set(k, record[k])
        self.tick()
        return record

    def log(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json_line(record) + "\n")
            self._file.flush()

    def tick(self, force: bool = False) -> None:
        """Send the metrics if their interval passed (``force``: now)."""
        if self.metrics is None:
            return
        self.metrics.set("wait_ratio", self.wait_ratio())
        if force:
            self.metrics.emit()
        else:
            self.metrics.tick()
