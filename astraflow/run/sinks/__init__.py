"""Metric sinks: where `astraflow run` sends the metrics it collects, besides ``metrics.jsonl``
and the roles' Prometheus endpoints (docs/metrics.md).

``metrics.sinks: [tensorboard, wandb]`` picks them; every ``metrics.jsonl`` line reaches each
sink as scalars named ``<role>/<policy>/<gauge>`` at the line's step. A sink is a class behind
:class:`MetricSink`, one module each, its package imported only when it is built (missing: a
:class:`ConfigError` naming the extra to install).

Modules:

- :mod:`.tensorboard_sink`: The TensorBoard sink: an event file under ``metrics.tensorboard_dir``.
- :mod:`.wandb_sink`: The Weights & Biases sink: one wandb run named after the AstraFlow run.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from astraflow.core.errors import ConfigError


class MetricSink(Protocol):
    """Receives scalars; never raises on a value it cannot show (it skips it)."""

    def write(self, values: Mapping[str, float], step: int, wall_time: float) -> None:
        """``values`` (tag -> number) measured at ``step``, ``wall_time`` seconds since the
        epoch."""

    def close(self) -> None:
        """Flush and release (the run ended)."""


#: sink name -> (module, factory, the pip extra that installs its package, the package)
SINKS: dict[str, tuple[str, str, str, str]] = {
    "tensorboard": ("astraflow.run.sinks.tensorboard_sink", "TensorBoardSink", "tensorboard",
                    "tensorboard"),
    "wandb": ("astraflow.run.sinks.wandb_sink", "WandbSink", "wandb", "wandb"),
}


def require(package: str, extra: str, sink: str) -> Any:
    """Import ``package`` for sink ``sink``, or say how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise ConfigError(
            f"metrics.sinks has {sink!r} but the {package!r} package is not installed ({e}): "
            f"pip install 'astraflow[{extra}]', or remove {sink!r} from metrics.sinks") from None


def check_sinks(names: Sequence[str]) -> None:
    """Each sink of ``names`` is known and its package importable (else a ConfigError that
    says what to install): checked before a run starts, not when its RL phase does."""
    for name in names:
        if name not in SINKS:
            raise ConfigError(f"unknown metric sink {name!r} in metrics.sinks; valid: "
                              f"{', '.join(SINKS)}")
        _, _, extra, package = SINKS[name]
        require(package, extra, name)


def build_sinks(names: Sequence[str], *, out: Path, run: str, config: Mapping[str, Any],
                options: Any = None) -> list[MetricSink]:
    """The sinks ``names`` of run ``run`` writing under run directory ``out``; ``config``
    is the run's config as plain data (secrets redacted); ``options`` the ``metrics``
    config section (None: defaults)."""
    sinks: list[MetricSink] = []
    try:
        check_sinks(names)
        for name in names:
            module, factory, _, _ = SINKS[name]
            cls = getattr(importlib.import_module(module), factory)
            sinks.append(cls(out=out, run=run, config=config, options=options))
    except BaseException:
        for s in sinks:
            s.close()
        raise
    return sinks


def scalars(line: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """A ``metrics.jsonl`` line as (step, tag -> number): its numbers under the line's role
    and policy (see the module docstring); text fields, times and ids are left out."""
    source = str(line.get("source", ""))
    policy = line.get("policy")
    if source == "rollout":
        prefix = "rollout"
    elif "kind" in line:
        prefix = f"eval/{policy}"
    else:
        prefix = f"trainer/{policy}" if policy is not None else "trainer"
    skip = {"time", "elapsed", "step", "source", "policy", "kind", "task"}
    values: dict[str, float] = {}
    for k, v in line.items():
        if k in skip:
            continue
        if isinstance(v, Mapping):  # the team's versions: policy -> version
            values.update({f"{prefix}/{k}.{p}": float(n) for p, n in v.items()
                           if isinstance(n, (int, float))})
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            if k.startswith("lag."):
                values[f"lag/{k.removeprefix('lag.')}"] = float(v)
            else:
                values[f"{prefix}/{k}"] = float(v)
    return int(line.get("step", 0) or 0), values
