"""An arm of a benchmark that runs `astraflow run`: its command line and the runner of any
`astraflow` subcommand (bench/learning.py, quickstart.py, team_vs_alone.py too), its config (a
base YAML with --set overrides, RL from warm models, a time budget, an injected latency), the
warm-up run that makes those models, and the run itself (bench/multimodel.py, agentic.py,
elastic.py, chaos.py, remote.py)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def warm_models(run_dir: Path) -> dict[str, Path]:
    """The model directory of each policy RL started from in ``run_dir`` (its config-rl.yaml:
    the warm-up's exports, or the models as built when there was no warm-up)."""
    from astraflow.core.errors import ConfigError
    from astraflow.run.warmup import start_models

    try:
        return start_models(run_dir)
    except ConfigError as e:
        raise SystemExit(str(e)) from None


def arm_config(base: Path | Mapping[str, Any], overrides: Sequence[str],
               warm: Mapping[str, Path], *, seconds: float,
               latency: Mapping[str, Any] | None, workflow: str = "solver_verifier",
               latency_key: str = "verifier_latency") -> dict[str, Any]:
    """``base`` (a YAML file, or its content) with --set ``overrides``, RL only from the
    ``warm`` models, ``launch.timeout_s`` = ``seconds``, the injected latency (``workflow``'s
    kwarg ``latency_key``: the verifier's of bench/multimodel.py by default, the tool's in
    bench/agentic.py) set (or removed)."""
    import copy

    from astraflow.core.config import apply_overrides

    data = apply_overrides(read_yaml(base) if isinstance(base, Path) else copy.deepcopy(
        dict(base)), overrides)
    data["models"] = {p: {"path": str(path), "build": "none"} for p, path in warm.items()}
    launch = data.setdefault("launch", {})
    launch.update(timeout_s=seconds, stop_at_accuracy=None)
    launch.setdefault("warmup", {})["steps"] = 0
    kwargs = data.setdefault("rollout", {}).setdefault("workflow", {}).setdefault(
        "kwargs", {}).setdefault(workflow, {})
    kwargs.pop(latency_key, None)
    if latency is not None:
        kwargs[latency_key] = dict(latency)
    return data


def write_yaml(data: Mapping[str, Any], path: Path) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def set_args(sets: Sequence[str]) -> list[str]:
    """``--set S`` for each of ``sets``."""
    return [a for s in sets for a in ("--set", s)]


def cli_run_args(config: Path, out: Path, sets: Sequence[str] = (), flags: Sequence[str] = (),
                 *, fresh: bool = True) -> list[str]:
    """The arguments of `astraflow run CONFIG --out OUT --no-live [--fresh] FLAGS --set ...`
    (an arm's directory: ``fresh`` replaces it on a rerun)."""
    return ["run", str(config), "--out", str(out), "--no-live", *(["--fresh"] if fresh else []),
            *flags, *set_args(sets)]


def astraflow(args: Sequence[str], log: Path, *, timeout: float | None = None,
              cwd: Path | None = ROOT) -> int:
    """Run `astraflow ARGS` with this interpreter (:func:`astraflow.core.launcher.cli`), in
    ``cwd`` (None: this process's), its stdout and stderr to ``log``; its exit code.
    ``timeout``: subprocess.TimeoutExpired past it."""
    from astraflow.core.launcher import cli

    with open(log, "w") as fh:
        return subprocess.run(cli(*args), stdout=fh, stderr=subprocess.STDOUT, cwd=cwd,
                              timeout=timeout).returncode


def astraflow_run(config: Path, out: Path, log: Path, sets: Sequence[str] = (),
                  flags: Sequence[str] = ()) -> int:
    """An arm's `astraflow run` (:func:`cli_run_args`, said on stdout), in the repository
    root, its output to ``log``; its exit code."""
    print(f"  $ astraflow run {config} --out {out} --fresh {' '.join(flags)} "
          f"{' '.join(f'--set {s}' for s in sets)}", flush=True)
    return astraflow(cli_run_args(config, out, sets, flags), log)


def make_warm(config: Mapping[str, Any], overrides: Sequence[str], out: Path) -> Path:
    """Run the config's warm-up once (`astraflow run --warmup-only`; without a warm-up,
    launch.warmup.steps 0, a run of one second leaves the models as built); its run
    directory."""
    import copy

    from astraflow.core.config import apply_overrides

    run_dir = out / "warmup"
    data = apply_overrides(copy.deepcopy(dict(config)), overrides)
    warms = data.get("launch", {}).get("warmup", {}).get("steps", 0) > 0
    if not warms:
        data = apply_overrides(data, ["launch.timeout_s=1", "launch.stop_at_accuracy=null",
                                      "launch.evaluate=false"])
    cfg = write_yaml(data, out / "warmup.yaml")
    t0 = time.monotonic()
    code = astraflow_run(cfg, run_dir, out / "warmup.log",
                         flags=["--warmup-only"] if warms else [])
    print(f"[warmup] exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
    if not (run_dir / "config-rl.yaml").exists():
        raise SystemExit(f"the warm-up run left no config-rl.yaml; see {out / 'warmup.log'}")
    return run_dir
