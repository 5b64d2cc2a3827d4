"""`astraflow replay RUN_DIR`: re-train a run's policies from its log and check every version.

Per policy, a fresh trainer built from the run's config and starting weights trains the batches
the run's trainer trained, in the order of its JSON log; after each step the digest of every
tensor is compared with the run's manifest of that version, and the first tensor that differs
is named. A run trained by several ranks is refused. What makes a trainer reproducible
(``trainer.threads``, ``trainer.deterministic``): docs/trainer.md#replay.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.core.errors import AstraflowError

_ORIGIN = re.compile(r"^(?P<topic>.+)\[(?P<partition>\d+)\]@(?P<offset>\d+)$")


class ReplayError(AstraflowError):
    """The run cannot be replayed (what is missing, and why)."""


@dataclass(frozen=True)
class Step:
    """One step of the run's trainer: the version it made and the batch it trained."""

    version: int
    batch_id: str
    topic: str
    partition: int
    offset: int


@dataclass
class PolicyReplay:
    """What replaying one policy found."""

    policy: str
    steps: int = 0  # steps retrained
    checked: int = 0  # versions whose digests were compared
    first_difference: str | None = None  # "version v: tensor t ..."; None: all equal
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.first_difference is None

    def line(self) -> str:
        if self.ok:
            return (f"{self.policy}: {self.checked} versions reproduced bit for bit "
                    f"({self.steps} steps retrained in {self.seconds:.1f} s)")
        return f"{self.policy}: {self.first_difference}"


def run_config(run_dir: Path, overrides: list[str] | None = None) -> Any:
    """The config the run's trainers ran with (``config-rl.yaml`` after a warm-up), with
    ``overrides`` (``a.b=c``) applied."""
    from astraflow.config import load_experiment

    for name in ("config-rl.yaml", "config.yaml"):
        if (run_dir / name).is_file():
            return load_experiment(run_dir / name, overrides or [])
    raise ReplayError(f"{run_dir}: no config.yaml: not a run directory")


def trained_steps(log: Path) -> list[Step]:
    """The steps of a trainer's JSON log since its last start from version 0 (the RL phase:
    a warm-up's SFT steps come before it), one per version in order (the last line of each
    step: a resumed trainer logs the steps after its checkpoint again); ReplayError when a
    step is missing."""
    if not log.is_file():
        raise ReplayError(f"{log}: no such trainer log (trainer.log_jsonl: false?)")
    last: dict[int, dict[str, Any]] = {}
    for line in log.read_text().splitlines():
        row = json.loads(line)
        if row.get("event") == "start" and not row.get("resumed"):
            last = {}  # a trainer from version 0: the RL phase after a warm-up's SFT steps
        elif "step" in row and "origin" in row and "batch_id" in row:
            last[int(row["step"])] = row
    if any("-sft-" in str(r["batch_id"]) for r in last.values()):
        raise ReplayError(f"{log}: its last trainer ran the SFT warm-up (a --warmup-only run?); "
                          "replay covers the RL phase, which this run does not have")
    steps = []
    for v in range(1, max(last, default=0) + 1):
        if v not in last:
            raise ReplayError(f"{log}: step {v} is not logged; replay needs every step")
        m = _ORIGIN.match(str(last[v]["origin"]))
        if m is None:
            raise ReplayError(f"{log}: step {v}: unreadable origin {last[v]['origin']!r}")
        steps.append(Step(v, str(last[v]["batch_id"]), m["topic"], int(m["partition"]),
                          int(m["offset"])))
    return steps


def published(bus: Any, run: str, policy: str) -> dict[int, Any]:
    """The run's manifest of each version of ``policy`` (the last one written: a resumed
    trainer publishes the versions after its checkpoint again)."""
    from astraflow.core.records import WeightManifest
    from astraflow.core.topics import topic_name
    from astraflow.run.accounting import read_topic

    out: dict[int, Any] = {}
    for _p, _o, m in read_topic(bus, topic_name(run, "weights", policy), WeightManifest):
        if m.policy == policy:
            out[m.version] = m
    return out


def differing_tensor(tensors: dict[str, Any], manifest: Any) -> str | None:
    """The first tensor of ``manifest`` whose digest ``tensors`` do not reproduce."""
    from astraflow.weights.bits import as_bits, digest

    for entry in manifest.tensors:
        if entry.rows:
            raise ReplayError(f"version {manifest.version} was published from shards (rows "
                              f"of {entry.name!r}): replay runs one process")
        if entry.name not in tensors:
            return f"tensor {entry.name!r} is in the manifest, not in the replayed model"
        _dtype, bits = as_bits(tensors[entry.name], name=entry.name, dtype=entry.dtype)
        got = digest(bits.reshape(-1))
        if got != entry.digest:
            return f"tensor {entry.name!r}: digest {got} where the run published {entry.digest}"
    return None


def retraining(config: Any, run_dir: Path, policy: str, bus: Any, *, what: str = "replay"
               ) -> tuple[Any, int, Iterator[tuple[Step, dict[str, float]]]]:
    """A fresh train state of ``policy`` built from ``config`` and the run's starting
    weights, the number of steps the run's trainer took, and the generator that trains the
    state on the run's batches in its order, yielding (step, the step's metrics) after each."""
    from astraflow.consumers.trainer.build import build_train_state, step_function
    from astraflow.consumers.trainer.loop import resolve
    from astraflow.core.fetch import fetch
    from astraflow.core.records import Batch, decode
    from astraflow.run.resources import model_dir
    from astraflow.run.roles import claims

    if config.launch.trainer_ranks > 1:
        raise ReplayError(f"{policy}: the run trained on {config.launch.trainer_ranks} ranks; "
                          f"{what} runs one process (a sharded {what} is not built yet)")
    tc = config.trainer_for(policy)
    steps = trained_steps(run_dir / f"trainer-{policy}.jsonl")
    state = build_train_state(tc, model_dir(config, policy, run_dir))
    step = step_function(tc.mode)
    store = claims(config, run_dir)

    def run() -> Iterator[tuple[Step, dict[str, float]]]:
        for s in steps:
            (msg,) = fetch(bus, s.topic, [(s.partition, s.offset)]).values()
            batch = decode(msg.value, Batch)
            if batch.id != s.batch_id:
                raise ReplayError(f"{s.topic}[{s.partition}]@{s.offset} holds batch "
                                  f"{batch.id!r}, the log says "
                                  f"{s.batch_id!r}")
            yield s, step(state, resolve(bus, batch, store), s.version - 1)

    return state, len(steps), run()


def replay_policy(config: Any, run_dir: Path, policy: str, bus: Any,
                  progress: Callable[[int, int], None] | None = None) -> PolicyReplay:
    """Retrain ``policy`` from the run's batches and compare each published version."""
    state, n, steps = retraining(config, run_dir, policy, bus)
    manifests = published(bus, config.run, policy)
    result = PolicyReplay(policy)
    started = time.monotonic()
    for s, _metrics in steps:
        result.steps += 1
        manifest = manifests.get(s.version)
        if manifest is not None:
            why = differing_tensor(state.state_tensors(), manifest)
            result.checked += 1
            if why is not None:
                result.first_difference = (f"version {s.version} differs (batch "
                                           f"{s.batch_id}): {why}")
                break
        if progress is not None:
            progress(s.version, n)
    result.seconds = time.monotonic() - started
    return result


def replay(run_dir: str | Path, policies: list[str] | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> Iterator[PolicyReplay]:
    """Replay each policy of the run in ``run_dir`` (all by default), one after another."""
    from astraflow.run.resources import open_bus

    run_dir = Path(run_dir)
    config = run_config(run_dir)
    names = policies or list(config.policies)
    unknown = [p for p in names if p not in config.policies]
    if unknown:
        raise ReplayError(f"no policy {', '.join(unknown)} in the run; its policies: "
                          f"{', '.join(config.policies)}")
    bus = open_bus(config, run_dir)
    try:
        for p in names:
            yield replay_policy(config, run_dir, p, bus,
                                None if progress is None else
                                (lambda v, n, p=p: progress(p, v, n)))  # type: ignore[misc]
    finally:
        bus.close()
