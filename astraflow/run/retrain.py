"""`astraflow retrain RUN_DIR --set trainer.… --out NEW`: a counterfactual trained on a run's data.

The run's batches, in the order its trainer took them, train a fresh trainer built from the
run's config with the given trainer keys changed; at every version the run's evaluator
measured, the counterfactual is measured the same way on the same held-out problems. It
compares update rules on identical data, off-policy (docs/trainer.md). NEW gets
``metrics.jsonl`` in the run's format (so :mod:`astraflow.run.compare` reads both),
``trainer-<policy>.jsonl``, ``config.yaml`` and ``retrain.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astraflow.core.jsonl import json_line
from astraflow.run.replay import ReplayError, retraining, run_config

#: what a counterfactual may change: the update rule, not which data exists
ALLOWED = ("trainer.", "trainers.")


@dataclass
class Retrained:
    """What retraining one policy produced."""

    policy: str
    steps: int = 0
    evals: list[tuple[int, float]] = field(default_factory=list)  # (version, accuracy)
    original: dict[int, float] = field(default_factory=dict)  # the run's, same versions

    def line(self) -> str:
        if not self.evals:
            return f"{self.policy}: {self.steps} steps retrained; the run evaluated no version"
        v, acc = self.evals[-1]
        return (f"{self.policy}: {self.steps} steps retrained; held-out accuracy at version {v}:"
                f" {acc:.3f} (the run: {self.original[v]:.3f})")


def check_overrides(overrides: list[str]) -> None:
    """ReplayError unless every override changes a trainer key."""
    bad = [o for o in overrides if not o.split("=", 1)[0].strip().startswith(ALLOWED)]
    if bad:
        raise ReplayError(f"retrain changes the trainer only (trainer.* or trainers.<policy>.*); "
                          f"not {', '.join(bad)}: a data policy or the rollout would change which "
                          "trajectories exist, which a recorded run cannot answer")


def run_evals(run_dir: Path, policy: str) -> dict[int, float]:
    """The versions the run's evaluator of ``policy`` measured, and what it measured."""
    out: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if (row.get("policy") == policy and "eval_accuracy" in row
                and str(row.get("source", "")).startswith("evaluator")):
            out[int(row["step"])] = float(row["eval_accuracy"])
    return out


def _serve(state: Any, evaluator: Any, dtype: str | None, version: int) -> None:
    """The train state's weights into the evaluator's model, as the run's evaluator received them
    (cast to the serving dtype ``weights.dtype``)."""
    from astraflow.weights.bits import as_bits

    # LoRA: the adapter's tensors, merged into the model at finish_version
    if state.adapter is not None:
        evaluator.target.set_adapter(state.adapter)
    for name, t in state.state_tensors().items():
        kind, bits = as_bits(t, name=name, dtype=dtype)
        evaluator.target.apply(name, kind, tuple(t.shape), bits)
    evaluator.target.finish_version(version)


def retrain_policy(config: Any, run_dir: Path, out: Path, policy: str, bus: Any,
                   write: Callable[[dict[str, Any]], None],
                   progress: Callable[[int, int], None] | None = None) -> Retrained:
    from astraflow.run.roles import configured_evaluator

    state, n, steps = retraining(config, run_dir, policy, bus, what="retrain")
    original = run_evals(run_dir, policy)
    evaluator = configured_evaluator(config, policy, run_dir, bus=bus)
    result = Retrained(policy, original=original)
    log = (out / f"trainer-{policy}.jsonl").open("w")

    def measure(version: int) -> None:
        if version not in original:
            return
        _serve(state, evaluator, config.weights.dtype, version)
        acc, extra = evaluator.measure()
        result.evals.append((version, acc))
        write({"source": f"evaluator-{policy}", "step": version, "policy": policy,
               "kind": evaluator.kind, "eval_accuracy": acc, **extra,
               "time": time.time()})

    try:
        measure(0)
        for s, metrics in steps:
            result.steps += 1
            row = {"step": s.version, "batch_id": s.batch_id, **metrics}
            log.write(json_line(row) + "\n")
            write({"source": f"trainer-{policy}", "policy": policy, **row, "time": time.time()})
            measure(s.version)
            if progress is not None:
                progress(s.version, n)
    finally:
        log.close()
        evaluator.close()
    return result


def retrain(run_dir: str | Path, overrides: list[str], out: str | Path,
            policies: list[str] | None = None,
            progress: Callable[[str, int, int], None] | None = None) -> Iterator[Retrained]:
    """Retrain each policy of the run in ``run_dir`` (all by default) with ``overrides``
    applied to its trainer config, writing into ``out`` (which must not exist yet)."""
    from astraflow.run.resources import open_bus

    run_dir, out = Path(run_dir), Path(out)
    check_overrides(overrides)
    base = run_config(run_dir)  # the run's own config: ReplayError when there is none
    config = run_config(run_dir, overrides)
    if out.exists():
        raise ReplayError(f"{out} exists: give retrain a new directory")
    names = policies or list(config.policies)
    unknown = [p for p in names if p not in config.policies]
    if unknown:
        raise ReplayError(f"no policy {', '.join(unknown)} in the run; its policies: "
                          f"{', '.join(config.policies)}")
    out.mkdir(parents=True)
    (out / "retrain.json").write_text(json.dumps(
        {"from": str(run_dir.resolve()), "overrides": overrides, "policies": names,
         "run": base.run}, indent=1) + "\n")
    from astraflow.run.launch import write_config

    write_config(config, out / "config.yaml")  # the run's, with the overrides
    bus = open_bus(base, run_dir)
    metrics = (out / "metrics.jsonl").open("w")

    def write(row: dict[str, Any]) -> None:
        metrics.write(json_line(row) + "\n")
        metrics.flush()

    try:
        for p in names:
            yield retrain_policy(config, run_dir, out, p, bus, write,
                                 None if progress is None else
                                 (lambda v, n, p=p: progress(p, v, n)))  # type: ignore[misc]
    finally:
        metrics.close()
        bus.close()
