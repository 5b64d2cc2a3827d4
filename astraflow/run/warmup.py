"""The SFT warm-up phase of `astraflow run`, and where it stops (``launch.warmup``).

Demonstrations go through the bus to `astraflow train` in ``sft`` mode; RL starts from what it
left. Without ``target_accuracy`` it runs ``steps`` steps; with a band ``[low, high]`` the
held-out accuracy of every ``check_every``-th checkpoint is measured while training goes on,
and RL starts from the first inside the band (``on_miss`` decides if none lands by ``steps``).
The outcome is ``warmup.json``; the checks are :mod:`astraflow.run.warmup_checks`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.core.errors import ConfigError
from astraflow.core.jsonl import json_line
from astraflow.core.launcher import cli
from astraflow.core.paths import expand
from astraflow.run.launch import (
    RL_CONFIG,
    export_model,
    newest_checkpoint,
    produce_demonstrations,
    role_env,
    warmup_config,
    write_config,
)
from astraflow.run.progress import Ticker, warmup_line
from astraflow.run.resources import create_run_topics, model_dir
from astraflow.run.supervisor import RoleSpec, Supervisor
from astraflow.run.warmup_checks import BandWatch, Check, CheckpointWatch, HeldOutProbe

log = logging.getLogger("astraflow.run.warmup")

RESULT = "warmup.json"


# ------------------------------------------------------------------------------- the phase

@dataclass
class PolicyWarmup:
    """Where one policy's warm-up stands while it runs."""

    policy: str
    watch: BandWatch
    probe: HeldOutProbe
    checkpoints: CheckpointWatch
    outcome: str | None = None  # once decided: in_band | closest | missed | failed
    chosen: Check | None = None
    stopped_at: int | None = None  # trainer step when it was stopped (None: ran to the cap)

    def pinned(self, step: int) -> Path:
        return self.checkpoints.keep / f"step-{step:010d}"


def run_warmup(config: ExperimentConfig, out: Path, bus: Any, sup: Supervisor,
               console: Any, ticker: Ticker | None = None) -> ExperimentConfig | None:
    """Run the warm-up; the RL phase's config (each policy's model: the warm-up's result),
    or None when it failed (the reason is printed). ``ticker``: progress lines for a log."""
    started = time.time()
    ticker = ticker or Ticker(None)
    warm = warmup_config(config)
    path = write_config(warm, out / "config-warmup.yaml")
    create_run_topics(warm, bus)
    w = config.launch.warmup
    if all(w.band(p) is None for p in config.policies):
        return _fixed(config, warm, path, out, bus, sup, console, started, ticker)
    if any(w.band(p) is None for p in config.policies):
        raise ConfigError("launch.warmup: give every policy a target_accuracy (shared or "
                          "under launch.warmup.policies.<policy>) or none")
    with console.status("loading the held-out problems for the warm-up checks"):
        runs = {p: PolicyWarmup(p, BandWatch(_band(w.band(p))), HeldOutProbe(config, p, out),
                                CheckpointWatch(warm.trainer_for(p).checkpoint_root(out, p),
                                                out / "warmup" / p, w.check_every))
                for p in config.policies}
    for r in runs.values():  # the model as built: already in the band needs no SFT
        _measure(r, 0, None)
        if r.watch.landed is not None:
            r.outcome, r.chosen = "in_band", r.watch.landed
    todo = [p for p, r in runs.items() if r.outcome is None]
    if todo:
        with console.status("producing SFT demonstrations"):
            for p in todo:
                produce_demonstrations(config, warm, p, out, bus)
        sup.start([_trainer_role(config, path, out, p) for p in todo])
        _follow(config, runs, sup, console, ticker, started)
        sup.stop([f"warmup-{p}" for p in todo])
    for r in runs.values():
        if r.outcome is None:  # its trainer failed
            r.outcome = "failed"
    result = _record(config, runs, out, started, w.target_accuracy)
    if sup.failed:
        console.print(f"[red]warm-up failed: {', '.join(sup.failed)}[/]")
        return None
    return _start_from(config, runs, out, console, result)


def _band(band: tuple[float, float] | None) -> tuple[float, float]:
    assert band is not None
    return float(band[0]), float(band[1])


def _trainer_role(config: ExperimentConfig, path: Path, out: Path, policy: str) -> RoleSpec:
    return RoleSpec(f"warmup-{policy}", cli("train", str(path), "--policy", policy, "--out",
                                            str(out), "--no-publish"),
                    restart=config.launch.restart, terminal=True, env=role_env(config))


def _measure(r: PolicyWarmup, step: int, weights: Path | None) -> Check:
    t0 = time.monotonic()
    acc = r.probe.measure(weights)
    check = Check(step, acc, round(time.monotonic() - t0, 3), time.time())
    r.watch.add(check)
    log.info("warm-up check policy=%s step=%d accuracy=%.4f seconds=%.2f", r.policy, step, acc,
             check.seconds)
    return check


def _follow(config: ExperimentConfig, runs: dict[str, PolicyWarmup], sup: Supervisor,
            console: Any, ticker: Ticker, started: float) -> None:
    """Measure every new checkpoint until each policy landed in the band or its trainer is
    done; stop a trainer as soon as its policy landed."""
    from rich.progress import Progress

    pending = {p: r for p, r in runs.items() if r.outcome is None}
    with Progress(console=console) as progress:
        bars = {p: progress.add_task(_label(p, r), total=config.launch.warmup.steps_of(p))
                for p, r in pending.items()}
        while pending:
            ticker.tick(lambda: warmup_line(started, [
                (p, r.checkpoints.seen, config.launch.warmup.steps_of(p),
                 r.watch.checks[-1].accuracy if r.watch.checks else None)
                for p, r in runs.items()]))
            sup.check()  # restarts a dead trainer by the launch rules
            if sup.failed:
                return
            for p, r in list(pending.items()):
                # read before scanning: a trainer that is done wrote its last checkpoint
                done = sup.roles[f"warmup-{p}"].state == "done"
                for step, pinned in r.checkpoints.new():
                    _measure(r, step, pinned / "model.safetensors")
                    _prune_pins(r)
                    progress.update(bars[p], completed=step, description=_label(p, r))
                    if r.watch.landed is not None:
                        break
                if r.watch.landed is not None:
                    r.outcome, r.chosen = "in_band", r.watch.landed
                    r.stopped_at = r.checkpoints.seen
                    sup.stop([f"warmup-{p}"])
                elif done:
                    r.outcome, r.chosen = r.watch.outcome(config.launch.warmup.on_miss)
                else:
                    continue
                del pending[p]
            if pending:
                time.sleep(0.2)


def _label(policy: str, r: PolicyWarmup) -> str:
    band = r.watch.band
    last = r.watch.checks[-1] if r.watch.checks else None
    now = f"{last.accuracy:.3f} at step {last.step}" if last else "not measured yet"
    return f"SFT warm-up {policy}: held-out {now}, target [{band[0]:.2f}, {band[1]:.2f}]"


def _prune_pins(r: PolicyWarmup) -> None:
    """Keep only the pinned weights that can still be chosen: the closest check so far (the
    first one in the band once there is one) and those not measured yet (several checkpoints
    can be pinned in one scan when measuring falls behind)."""
    keep = r.pinned(r.watch.closest.step) if r.watch.closest is not None else None
    measured = r.watch.checks[-1].step if r.watch.checks else -1
    for d in r.checkpoints.keep.glob("step-*"):
        if d != keep and int(d.name.removeprefix("step-")) <= measured:
            shutil.rmtree(d, ignore_errors=True)


def _record(config: ExperimentConfig, runs: dict[str, PolicyWarmup], out: Path,
            started: float, band: tuple[float, float] | None) -> dict[str, Any]:
    """``warmup.json``, and one ``metrics.jsonl`` line per check. The lines are written when
    the warm-up is over, so their ``elapsed`` counts back from the RL phase's start
    (negative); ``step`` is the RL trainer's step, 0 during the warm-up."""
    w = config.launch.warmup
    ended = time.time()
    result: dict[str, Any] = {
        "band": list(band) if band else None, "check_every": w.check_every,
        "cap": w.steps, "on_miss": w.on_miss, "lr": w.lr, "seconds": round(ended - started, 1),
        "policies": {}}
    lines: list[dict[str, Any]] = []
    for p, r in runs.items():
        chosen = r.chosen
        result["policies"][p] = {
            "band": list(r.watch.band), "outcome": r.outcome,
            "step": chosen.step if chosen else None,
            "accuracy": chosen.accuracy if chosen else None, "stopped_at": r.stopped_at,
            "checks": [[c.step, c.accuracy] for c in r.watch.checks],
            "jumps": [[a.step, a.accuracy, b.step, b.accuracy] for a, b in r.watch.jumps],
            "missed_checks": r.checkpoints.missed,
            "check_seconds": round(sum(c.seconds for c in r.watch.checks), 2)}
        lines += [{"time": c.time, "elapsed": round(c.time - ended, 3), "source": f"warmup-{p}",
                   "phase": "warmup", "step": 0, "warmup_step": c.step,
                   "warmup_accuracy": c.accuracy} for c in r.watch.checks]
    (out / RESULT).write_text(json.dumps(result, indent=2))
    if lines:
        with (out / "metrics.jsonl").open("a") as f:
            f.writelines(json_line(x) + "\n" for x in sorted(lines, key=lambda x: x["time"]))
    return result


def _start_from(config: ExperimentConfig, runs: dict[str, PolicyWarmup], out: Path,
                console: Any, result: dict[str, Any]) -> ExperimentConfig | None:
    """The RL phase's config, each policy starting from its chosen check; None (and why)
    when a policy missed the band and ``on_miss`` is ``error``."""
    for p, r in runs.items():
        if r.checkpoints.missed:
            console.print(f"[yellow]warning: warm-up of {p}: {len(r.checkpoints.missed)} "
                          "checkpoint(s) were pruned by the trainer before they could be "
                          f"measured (steps {r.checkpoints.missed[:5]}): this host is too "
                          "busy for launch.warmup.check_every; a check may have been skipped[/]")
    missed = [p for p, r in runs.items() if r.outcome == "missed"]
    for p in missed:
        console.print(f"[red]warm-up of {p} missed launch.warmup.target_accuracy: "
                      f"{runs[p].watch.describe_miss()}. RL does not start "
                      "(launch.warmup.on_miss: error; `closest` starts from the nearest "
                      f"check instead). Checks: {out / RESULT}[/]")
    if missed:
        return None
    data = config.model_dump()
    for p, r in runs.items():
        chosen = r.chosen
        assert chosen is not None
        band = r.watch.band
        if r.outcome == "closest":
            console.print(f"[yellow]warning: warm-up of {p} never reached [{band[0]}, "
                          f"{band[1]}]: {r.watch.describe_miss()}. RL starts from the nearest "
                          f"check (launch.warmup.on_miss: closest).[/]")
        else:
            console.print(f"[green]warm-up of {p}: held-out accuracy {chosen.accuracy:.3f} at "
                          f"step {chosen.step}, inside [{band[0]}, {band[1]}]: RL starts "
                          "there[/]")
        if chosen.step == 0:
            continue  # the model as built
        dest = export_model(r.pinned(chosen.step), model_dir(config, p, out),
                            out / "models" / f"{p}-warm")
        data.setdefault("models", {})[p] = {"path": str(dest), "build": "none"}
    shutil.rmtree(out / "warmup", ignore_errors=True)
    console.print(f"SFT warm-up done in {result['seconds']:.0f} s; RL starts from "
                  f"{out / 'models'}")
    return ExperimentConfig.model_validate(data)


def _fixed(config: ExperimentConfig, warm: ExperimentConfig, path: Path, out: Path, bus: Any,
           sup: Supervisor, console: Any, started: float,
           ticker: Ticker) -> ExperimentConfig | None:
    """``target_accuracy: null``: exactly ``steps`` SFT steps, RL from the last."""
    from rich.progress import Progress

    from astraflow.run.collector import Collector

    steps = config.launch.warmup.steps
    with console.status("producing SFT demonstrations"):
        for p in config.policies:
            produce_demonstrations(config, warm, p, out, bus)
    sup.start([_trainer_role(config, path, out, p) for p in config.policies])
    col = Collector(bus, warm.run, policies=config.policies)
    with Progress(console=console) as progress:
        task = progress.add_task("SFT warm-up", total=steps)
        while sup.check():
            col.poll(0.5)
            progress.update(task, completed=col.trainer_step())
            ticker.tick(lambda: warmup_line(started, [
                (p, col.trainer_step(p), config.launch.warmup.steps_of(p), None)
                for p in config.policies]))
        progress.update(task, completed=col.trainer_step())
    col.close()
    if sup.failed:
        console.print(f"[red]warm-up failed: {', '.join(sup.failed)}[/]")
        return None
    data = config.model_dump()
    for p in config.policies:
        ck = newest_checkpoint(warm.trainer_for(p).checkpoint_root(out, p))
        if ck is None:
            console.print(f"[red]warm-up of {p} left no checkpoint[/]")
            return None
        dest = export_model(ck, model_dir(config, p, out), out / "models" / f"{p}-warm")
        data.setdefault("models", {})[p] = {"path": str(dest), "build": "none"}
    result = {"band": None, "cap": steps, "lr": config.launch.warmup.lr,
              "seconds": round(time.time() - started, 1),
              "policies": {p: {"outcome": "fixed", "step": config.launch.warmup.steps_of(p)}
                           for p in config.policies}}
    (out / RESULT).write_text(json.dumps(result, indent=2))
    console.print(f"SFT warm-up done: {steps} steps; RL starts from {out / 'models'}")
    return ExperimentConfig.model_validate(data)


def start_models(run_dir: Path) -> dict[str, Path]:
    """The model directory each policy's RL phase started from (or starts from) in
    ``run_dir``, a directory of `astraflow run` whose warm-up ended (``--warmup-only`` or a
    whole run): its ``config-rl.yaml`` names the warm-up's exports, or the models as built for
    a policy that had no warm-up. Refused with the reason when ``run_dir`` is no such
    directory or a model is gone."""
    path = run_dir / RL_CONFIG
    if not path.is_file():
        raise ConfigError(f"--warm {run_dir}: no {RL_CONFIG} there, so no warm-up ended in it "
                          "(make one with `astraflow run CONFIG --warmup-only --out DIR`)")
    cfg = load_experiment(path)
    # where each model is, not model_dir(): that would build a tiny model that is gone; a
    # gguf file, hub id or shortcut that no warm-up replaced is where it resolves to
    from astraflow.models.source import classify, resolve

    def where(policy: str) -> Path:
        mc = cfg.model(policy)
        text = expand(mc.path, out=run_dir, policy=policy)
        if mc.build == "none" and classify(text) in ("gguf", "hub", "shortcut"):
            return resolve(text, key=f"models.{policy}.path")
        return Path(text).resolve()

    models = {p: where(p) for p in cfg.policies}
    gone = [f"--warm {run_dir}: the model of policy {p!r} is gone ({m} has no config.json)"
            for p, m in models.items() if not (m / "config.json").is_file()]
    if gone:
        raise ConfigError(gone)
    return models


def from_warm(config: ExperimentConfig, run_dir: Path) -> ExperimentConfig:
    """``config`` with every policy starting RL from ``run_dir``'s models
    (:func:`start_models`) and no warm-up of its own (`astraflow run --warm`). ``run_dir``
    may hold more policies than ``config`` (the solver of a solver + verifier run); a policy
    of ``config`` that it lacks is refused."""
    models = start_models(run_dir)
    absent = [p for p in config.policies if p not in models]
    if absent:
        raise ConfigError([f"--warm {run_dir}: no model of policy {p!r} there (its policies: "
                           f"{', '.join(models)})" for p in absent])
    data = config.model_dump()
    for p in config.policies:
        data.setdefault("models", {})[p] = {"path": str(models[p]), "build": "none"}
    data["launch"]["warmup"]["steps"] = 0
    return ExperimentConfig.model_validate(data)


def reuse(config: ExperimentConfig, out: Path) -> ExperimentConfig | None:
    """A resumed run (``--resume``) whose warm-up already ended: the RL config it chose
    (its ``warmup.json`` and exported models), or None to run the warm-up."""
    try:
        result = json.loads((out / RESULT).read_text())
    except (OSError, ValueError):
        return None
    data = config.model_dump()
    for p in config.policies:
        r = result.get("policies", {}).get(p)
        if r is None or r.get("outcome") not in ("in_band", "closest", "fixed"):
            return None
        if r.get("step") == 0:
            continue
        dest = out / "models" / f"{p}-warm"
        if not (dest / "model.safetensors").exists():
            return None
        data.setdefault("models", {})[p] = {"path": str(dest), "build": "none"}
    return ExperimentConfig.model_validate(data)
