"""Latency distributions: extra seconds a workflow waits at some point of an episode, standing in
for a slow checker, a long analysis or a tool call.

A spec's ``type`` is ``fixed`` (or a bare number), ``uniform``, ``lognormal`` (by ``p50`` and
``p99``), ``trace`` (recorded seconds from a file) or ``phases`` (by the wall clock).
:func:`parse_latency` reads one from configuration; :func:`wait` draws with the caller's
``random.Random`` and ``asyncio.sleep``-s:

    >>> spec = parse_latency({"type": "lognormal", "p50": 0.05, "p99": 2.0}, where="x")
    >>> seconds = await wait(spec, random.Random(f"{task.id}/{sample_index}"))
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from statistics import NormalDist
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import pydantic

from astraflow.core.config import Section
from astraflow.core.errors import ConfigError

Z99 = NormalDist().inv_cdf(0.99)  # 2.3263...: p99 of a lognormal is exp(mu + Z99 * sigma)


@runtime_checkable
class Latency(Protocol):
    """A distribution of non-negative seconds."""

    def sample(self, rng: random.Random) -> float:
        """One draw, in seconds (>= 0)."""

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0 < q < 1), in seconds: analytic where there is a formula."""


class FixedLatency(Section):
    """Always the same delay."""

    type: Literal["fixed"]
    seconds: float = pydantic.Field(ge=0, allow_inf_nan=False, description="the delay")

    def sample(self, rng: random.Random) -> float:
        return self.seconds

    def quantile(self, q: float) -> float:
        return self.seconds


class UniformLatency(Section):
    """Uniform between ``low`` and ``high`` seconds."""

    type: Literal["uniform"]
    low: float = pydantic.Field(ge=0, allow_inf_nan=False)
    high: float = pydantic.Field(ge=0, allow_inf_nan=False)

    @pydantic.field_validator("high")
    @classmethod
    def _ordered(cls, high: float, info: pydantic.ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and high < low:
            raise ValueError(f"must be >= low ({low:g})")
        return high

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)

    def quantile(self, q: float) -> float:
        return self.low + _q(q) * (self.high - self.low)


class LognormalLatency(Section):
    """Lognormal given by its median ``p50`` and 99th percentile ``p99`` (the long tail)."""

    type: Literal["lognormal"]
    p50: float = pydantic.Field(gt=0, allow_inf_nan=False, description="median seconds")
    p99: float = pydantic.Field(gt=0, allow_inf_nan=False, description="99th percentile")

    @pydantic.field_validator("p99")
    @classmethod
    def _ordered(cls, p99: float, info: pydantic.ValidationInfo) -> float:
        p50 = info.data.get("p50")
        if p50 is not None and p99 <= p50:
            raise ValueError(f"must be > p50 ({p50:g}); for a constant delay use type: fixed")
        return p99

    @property
    def mu(self) -> float:
        return math.log(self.p50)

    @property
    def sigma(self) -> float:
        return (math.log(self.p99) - math.log(self.p50)) / Z99

    def sample(self, rng: random.Random) -> float:
        return rng.lognormvariate(self.mu, self.sigma)

    def quantile(self, q: float) -> float:
        return math.exp(self.mu + self.sigma * NormalDist().inv_cdf(_q(q)))


class TraceLatency(Section):
    """Recorded delays replayed from a file: ``cycle`` walks them in order (wrapping around,
    one position shared by every caller of this spec), ``sample`` draws one at random."""

    type: Literal["trace"]
    path: str = pydantic.Field(description="one number (seconds) a line, or a JSON list")
    order: Literal["cycle", "sample"] = "sample"
    _values: list[float] = pydantic.PrivateAttr(default_factory=list)
    _next: int = pydantic.PrivateAttr(0)

    @pydantic.model_validator(mode="after")
    def _load(self) -> TraceLatency:
        self._values = read_trace(Path(self.path))
        return self

    @property
    def values(self) -> list[float]:
        return list(self._values)

    def sample(self, rng: random.Random) -> float:
        if self.order == "sample":
            return rng.choice(self._values)
        value = self._values[self._next % len(self._values)]
        self._next += 1
        return value

    def quantile(self, q: float) -> float:
        ordered = sorted(self._values)
        return ordered[min(len(ordered) - 1, int(_q(q) * len(ordered)))]


class PhasesLatency(Section):
    """A delay that changes with the wall clock: ``phases`` is a cycle of ``[seconds,
    duration_s]`` — wait ``seconds`` during the first ``duration_s`` seconds of the cycle,
    and so on — counted from the Unix epoch, so every process of a run is in the same phase
    at the same time (a server that is slow at times; a load that comes and goes); ``start``
    moves the cycle's origin (a benchmark starts each arm at the same phase)."""

    type: Literal["phases"]
    phases: list[tuple[float, float]] = pydantic.Field(
        min_length=1, description="[seconds to wait, how long this phase lasts], in order")
    start: float = pydantic.Field(0.0, description="Unix time the first cycle begins")
    _clock: Any = pydantic.PrivateAttr(None)  # tests: a fake time.time

    @pydantic.field_validator("phases")
    @classmethod
    def _positive(cls, phases: list[tuple[float, float]]) -> list[tuple[float, float]]:
        for i, (seconds, duration) in enumerate(phases):
            if seconds < 0 or duration <= 0:
                raise ValueError(f"phase {i}: [{seconds:g}, {duration:g}]: the wait must be "
                                 ">= 0 and the duration > 0")
        return phases

    def now_seconds(self) -> float:
        import time

        t = ((self._clock or time.time)() - self.start) % sum(d for _, d in self.phases)
        for seconds, duration in self.phases:
            if t < duration:
                return seconds
            t -= duration
        return self.phases[-1][0]

    def sample(self, rng: random.Random) -> float:
        return self.now_seconds()

    def quantile(self, q: float) -> float:
        total = sum(d for _, d in self.phases)
        acc = 0.0
        for seconds, duration in sorted(self.phases):
            acc += duration / total
            if acc >= _q(q):
                return seconds
        return max(s for s, _ in self.phases)


LatencySpec = Annotated[FixedLatency | UniformLatency | LognormalLatency | TraceLatency
                        | PhasesLatency, pydantic.Field(discriminator="type")]
TYPES: dict[str, type[Section]] = {"fixed": FixedLatency, "uniform": UniformLatency,
                                   "lognormal": LognormalLatency, "trace": TraceLatency,
                                   "phases": PhasesLatency}
_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(LatencySpec)
_CACHE: OrderedDict[str, Latency] = OrderedDict()
_CACHE_SIZE = 64


def _q(q: float) -> float:
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q!r} must be in (0, 1)")
    return q


def read_trace(path: Path) -> list[float]:
    """The seconds recorded in ``path``: a JSON list, or one number a line (blank lines and
    ``#`` comments skipped). Raises ValueError naming the file and line of a bad value."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read trace file {str(path)!r}: {e.strerror or e}") from None
    if text.lstrip().startswith("["):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"trace file {str(path)!r} is not a valid JSON list: {e}") from None
        items = [(f"item {i}", v) for i, v in enumerate(raw)]
    else:
        items = [(f"line {n}", line.split("#", 1)[0].strip())
                 for n, line in enumerate(text.splitlines(), 1)]
        items = [(where, v) for where, v in items if v]
    values = []
    for where, v in items:
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(v, bool) or not math.isfinite(x) or x < 0:
            raise ValueError(f"trace file {str(path)!r} {where}: {v!r} is not a finite "
                             "number of seconds >= 0")
        values.append(x)
    if not values:
        raise ValueError(f"trace file {str(path)!r} holds no values")
    return values


def parse_latency(value: Latency | Mapping[str, Any] | float | None, *,
                  where: str = "latency") -> Latency | None:
    """A latency spec from configuration: None (no latency), a number (fixed seconds), a
    mapping with ``type`` (see the module docstring) or a spec already. Raises ConfigError
    naming ``where`` and the bad key, with every problem at once. Mappings are parsed once and
    cached, so a spec given as a workflow kwarg is not re-read (trace files) per episode and a
    ``cycle`` trace keeps its position."""
    if value is None or isinstance(value, Latency):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, Mapping)):
        raise ConfigError(f"{where}: expected a mapping with 'type' ({', '.join(TYPES)}), a "
                          f"number of seconds or null; got {type(value).__name__} {value!r}")
    if isinstance(value, (int, float)):
        value = {"type": "fixed", "seconds": value}
    try:
        key = json.dumps(dict(value), sort_keys=True, default=str)
    except (TypeError, ValueError):
        key = None
    if key is not None and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    spec = _validate(dict(value), where)
    if key is not None:
        _CACHE[key] = spec
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return spec


def _validate(data: dict[str, Any], where: str) -> Latency:
    kind = data.get("type")
    if kind not in TYPES:
        hint = " (the key is 'type', not 'dist')" if "dist" in data and kind is None else ""
        got = "missing" if kind is None else f"unknown type {kind!r}"
        raise ConfigError(f"{where}.type: {got}{hint}; valid: {', '.join(TYPES)}")
    try:
        spec: Latency = _ADAPTER.validate_python(data)
    except pydantic.ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"][1:])  # [0] is the type tag
            path = f"{where}.{loc}" if loc else where
            if err["type"] == "extra_forbidden":
                fields = sorted(TYPES[kind].model_fields)
                problems.append(f"{path}: unknown key for type {kind}; valid keys: "
                                f"{', '.join(fields)}")
                continue
            msg = str(err["msg"]).removeprefix("Value error, ")
            got = (f" (got {err['input']!r})" if loc and "input" in err
                   and err["type"] != "missing" else "")
            problems.append(f"{path}: {msg}{got}")
        raise ConfigError(problems) from None
    return spec


async def wait(latency: Latency | None, rng: random.Random) -> float:
    """Sleep one draw of ``latency`` (without blocking the event loop) and return the
    seconds drawn; 0.0 at once when ``latency`` is None."""
    if latency is None:
        return 0.0
    seconds = latency.sample(rng)
    if seconds > 0:
        await asyncio.sleep(seconds)
    return seconds
