"""`astraflow run`, step by step: prepare the run directory and models, the optional SFT
warm-up phase, the RL phase with every role supervised, then plots, summary and accounting."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from astraflow.config import ExperimentConfig
from astraflow.core.errors import AstraflowError, BusError, ConfigError
from astraflow.core.topics import run_topics
from astraflow.run import exits
from astraflow.run.launch import (
    RL_CONFIG,
    export_model,
    newest_checkpoint,
    rl_roles,
    warmup_config,
    write_config,
)
from astraflow.run.progress import Ticker, rl_line
from astraflow.run.resources import create_run_topics, model_dir, open_bus
from astraflow.run.sinks import check_sinks
from astraflow.run.supervisor import Supervisor


def check_out(out: Path, *, fresh: bool, resume: bool) -> None:
    """Refuse what `astraflow run` must not do to ``out``: delete it unasked (an existing,
    non-empty directory needs ``--fresh`` or ``--resume``), delete a directory that is not a
    run's, or resume one that is not a run's."""
    if fresh and resume:
        raise AstraflowError("--fresh and --resume: give one (--fresh deletes the run "
                             "directory, --resume continues the run in it)")
    used = out.exists() and any(out.iterdir())
    is_run = (out / "config.yaml").exists()
    if used and not is_run:
        raise AstraflowError(f"{out} exists and is not an AstraFlow run directory (no "
                             "config.yaml); choose another --out or remove it")
    if used and not (fresh or resume):
        raise AstraflowError(
            f"the run directory {out} exists: nothing was started. Give --fresh to delete it "
            "and start over, --resume to continue that run (its topics and consumer offsets, "
            "the warm-up it finished, each trainer's newest checkpoint), or another --out")
    if resume and not used:
        raise AstraflowError(f"--resume: {out} holds no run to continue; start one without "
                             "--resume")


def _prepare_out(out: Path, *, fresh: bool, resume: bool) -> None:
    check_out(out, fresh=fresh, resume=resume)
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def _connect(config: ExperimentConfig, out: Path) -> Any:
    try:
        return open_bus(config, out, create_topics=False)
    except BusError as e:
        if config.bus.url.startswith("kafka://"):
            java = shutil.which("java") and shutil.which("mvn")
            hint = ("start a local broker with `astraflow broker start`" if java else
                    "a local broker needs Java 17 and Maven: apt-get install -y "
                    "openjdk-17-jre-headless maven, then `astraflow broker start`")
            raise AstraflowError(f"cannot use the Kafka bus {config.bus.url}: {e}. To run one "
                                 f"here, {hint}.") from e
        raise


def _check_unused(config: ExperimentConfig, bus: Any) -> None:
    """A fresh run needs fresh topics: a run name already used on this bus (e.g. a Kafka
    broker that outlives the run directory) would mix the two runs' records and offsets."""
    names = set(run_topics(config.run, config.policies))
    if config.launch.warmup.steps > 0:
        names |= set(run_topics(warmup_config(config).run, config.policies))
    used = sorted(names & set(bus.list_topics()))
    if used:
        bus.close()
        raise AstraflowError(
            f"run {config.run!r} already has topics on {config.bus.url} ({', '.join(used[:3])}"
            f"{', ...' if len(used) > 3 else ''}): a fresh run needs fresh topics. Choose "
            f"another name with --set run=NAME, or continue that run with --resume and its "
            "run directory")


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM stop the run the same graceful way (KeyboardInterrupt: every role
    stopped, the summary written), also when this process started with SIGINT ignored (nohup,
    a background job of a script): otherwise SIGINT did nothing and SIGTERM ended this
    process at once, leaving the roles, which run in sessions of their own, running."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def run_experiment(config: ExperimentConfig, out: Path, *, live: bool = True,
                   fresh: bool = False, resume: bool = False, warmup_only: bool = False,
                   progress: bool = False) -> int:
    """The whole run; with ``warmup_only``, the warm-up alone: its models, ``warmup.json``,
    ``config-rl.yaml`` (what RL would start from: ``astraflow run --warm``) and
    ``summary.json``. ``fresh`` deletes an existing run directory first, ``resume``
    continues the run in it; with neither, an existing one is refused (:func:`check_out`).
    ``progress``: a plain line every ``launch.progress_every_s`` (:mod:`astraflow.run.progress`).
    The exit code (:mod:`astraflow.run.exits`): 0; 3 when a role failed for good; 1 when
    the warm-up missed its band."""
    from rich.console import Console

    if warmup_only and config.launch.warmup.steps <= 0:
        raise ConfigError("--warmup-only: launch.warmup.steps is 0, so this config has no "
                          "warm-up to run")
    check_sinks(config.metrics.sinks)  # a missing package is said before anything starts
    _stop_on_signals()
    console = Console()
    out = out.resolve()
    _prepare_out(out, fresh=fresh, resume=resume)
    ticker = Ticker(config.launch.progress_every_s if progress else None)
    write_config(config, out / "config.yaml")
    from astraflow.core.launcher import prestart
    from astraflow.run.launch import role_env

    prestart(role_env(config))  # the fork server imports while the models are built
    with console.status("building models") as st:
        for p in config.policies:
            st.update(f"model of policy {p}")
            model_dir(config, p, out)
    bus = _connect(config, out)
    if not resume:
        _check_unused(config, bus)
    create_run_topics(config, bus)
    sup = Supervisor(out, max_restarts=config.launch.max_restarts,
                     grace_s=config.launch.stop_grace_s,
                     on_event=event_printer(console))
    try:
        rl = config
        if config.launch.warmup.steps > 0:
            warm = _warmup(config, out, bus, sup, console, resume=resume, ticker=ticker)
            if warm is None:
                return exits.run_code(sup.failed) or exits.ERROR
            rl = warm
        if warmup_only:
            return _warmup_only_done(rl, out, console)
        code = _rl_phase(rl, out, bus, sup, console, live=live, started=time.time(),
                         ticker=ticker)
    except BaseException:
        sup.stop()  # an interrupted warm-up, or an error: no role is left running unattended
        raise
    finally:
        bus.close()
    return code


def _warmup(config: ExperimentConfig, out: Path, bus: Any, sup: Supervisor, console: Any,
            *, resume: bool, ticker: Ticker) -> ExperimentConfig | None:
    """The SFT warm-up (astraflow.run.warmup); a resumed run reuses the one it finished."""
    from astraflow.run.warmup import reuse, run_warmup

    done = reuse(config, out) if resume else None
    if done is not None:
        console.print(f"warm-up already done: RL starts from {out / 'models'}")
        return done
    return run_warmup(config, out, bus, sup, console, ticker)


def _warmup_only_done(rl: ExperimentConfig, out: Path, console: Any) -> int:
    """``--warmup-only``: write where RL would start (``config-rl.yaml``) and the summary,
    and say how to start RL from it."""
    from astraflow.run.warmup import RESULT

    write_config(rl, out / RL_CONFIG)
    result = {"warmup_only": True, "warmup": json.loads((out / RESULT).read_text())}
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    for p, w in result["warmup"].get("policies", {}).items():
        console.print(f"warm-up {p}: {_landing(w)}")
    console.print(f"warm-up only: RL not started. Start it from these models with\n"
                  f"  astraflow run CONFIG --warm {out}", highlight=False)
    return 0


def _landing(w: dict[str, Any]) -> str:
    """Where a policy's warm-up stopped (its entry of ``warmup.json``), in a few words."""
    acc = "" if w.get("accuracy") is None else f"{w['accuracy']:.3f} at "
    return f"{acc}step {w.get('step')} ({w.get('outcome')})"


def _rl_phase(config: ExperimentConfig, out: Path, bus: Any, sup: Supervisor, console: Any,
              *, live: bool, started: float, ticker: Ticker) -> int:
    from rich.live import Live

    from astraflow.run.accounting import account
    from astraflow.run.collector import Collector
    from astraflow.run.lag import run_lags
    from astraflow.run.plots import plot_run, summary
    from astraflow.run.view import render

    path = write_config(config, out / RL_CONFIG)
    from astraflow.producers import task_name

    col = Collector(bus, config.run, jsonl=out / "metrics.jsonl", policies=config.policies,
                    task=task_name(config.producer), sinks=_sinks(config, out))
    from astraflow.run.launch import describe_split

    console.print(describe_split(config), highlight=False, soft_wrap=True)
    sup.start(rl_roles(config, path, out))
    scaler = _scaler(config, bus, sup, path, out)
    timeout = config.launch.timeout_s
    interrupted = False
    last_summary = 0.0

    def frame() -> Any:
        return render(col, lags=run_lags(bus, config), title=f"{config.run} → {out}",
                      processes=sup.states())

    try:
        with Live(frame(), console=console, refresh_per_second=2, transient=False) if live \
                else _Null() as view:
            while True:
                alive = sup.check()
                if scaler is not None:
                    scaler.run(None, 0.05)
                col.poll(0.3)
                ticker.tick(lambda: rl_line(col, config, run_lags(bus, config), started))
                if time.monotonic() - last_summary > 5:
                    col.write_summary(run_lags(bus, config))
                    last_summary = time.monotonic()
                    view.update(frame())
                if not alive:
                    break
                if timeout is not None and time.time() - started > timeout:
                    console.print("[yellow]launch.timeout_s of RL reached: stopping[/]")
                    break
                if _reached(config, col):
                    console.print(f"[green]held-out accuracy reached "
                                  f"launch.stop_at_accuracy={config.launch.stop_at_accuracy}: "
                                  "stopping[/]")
                    break
            # the evaluators take a version as the run's last once it has been left alone
            # IDLE_PACE times the pace of versions (VersionWatch): wait for that and more
            from astraflow.consumers.evaluator import IDLE_PACE

            per_step = (time.time() - started) / max(1, col.trainer_step())
            _await_final_eval(config, col, sup, timeout=180.0 + IDLE_PACE * per_step)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: stopping every role[/]")
    except BaseException:
        # the roles run in sessions of their own: nothing stops them if this process dies
        sup.stop()
        raise
    if scaler is not None:
        scaler.close()
    codes = sup.stop()
    col.poll(1.0)
    col.write_summary(run_lags(bus, config))
    ticker.tick(lambda: rl_line(col, config, run_lags(bus, config), started), force=True)
    col.close()
    from astraflow.run.breakdown import time_breakdown

    spent = time_breakdown(c.metric for c in col.components.values())
    return _finish(config, out, bus, sup, console, codes, interrupted, account, plot_run,
                   summary, spent)


def _sinks(config: ExperimentConfig, out: Path) -> list[Any]:
    """The run's metric sinks (``metrics.sinks``), given the run's name and redacted config."""
    if not config.metrics.sinks:
        return []
    import yaml

    from astraflow.core.config import dump_split
    from astraflow.run.sinks import build_sinks

    return build_sinks(config.metrics.sinks, out=out, run=config.run,
                       config=yaml.safe_load(dump_split(config)[0]), options=config.metrics)


def _scaler(config: ExperimentConfig, bus: Any, sup: Supervisor, path: Path,
            out: Path) -> Any:
    """The run's scaler (``scale.enabled``), acting through ``sup``; None when off."""
    if not config.scale.enabled:
        return None
    from astraflow.run.launch import role_env, share_env, sharing_roles
    from astraflow.run.scaling import run_scaler

    env = role_env(config)
    if any(r.startswith("rollout-") for r in sharing_roles(config)):
        env = {**env, **share_env(config, out)}  # workers it adds share the cores too
    return run_scaler(config, bus, sup, path, out, env)


def _team_evaluated(config: ExperimentConfig) -> bool:
    """Does `astraflow run` start a team evaluator (launch.rl_roles) for this run?"""
    return config.launch.evaluate and config.team_workflow() == "solver_verifier"


def _reached(config: ExperimentConfig, col: Any) -> bool:
    """Has every evaluator measured at least ``launch.stop_at_accuracy``: each policy's (its
    newest process: answer accuracy, or a verifier's balanced judgement accuracy) and, in a
    team run, the team's system accuracy?"""
    target = config.launch.stop_at_accuracy
    if target is None or not config.launch.evaluate:
        return False
    evs = col.evaluators()
    if not all(p in evs and evs[p].metric.gauges.get("eval_accuracy", -1.0) >= target
               for p in config.policies):
        return False
    if _team_evaluated(config):
        team = col.team_evaluator()
        return team is not None and team.metric.gauges.get("system_accuracy", -1.0) >= target
    return True


def _await_final_eval(config: ExperimentConfig, col: Any, sup: Supervisor,
                      timeout: float = 180.0) -> None:
    """Let each evaluator score its policy's final version (the team's: every policy's)
    before everything stops."""
    if not config.launch.evaluate or sup.failed:
        return
    final = _final_versions(config, col)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        col.poll(0.5)
        if _evaluated(config, col, final):
            return
        sup.check()


def _final_versions(config: ExperimentConfig, col: Any) -> dict[str, int]:
    """Each policy's final version: its trainer's step, or, where no trainer's component names
    the policy (several policies), the newest version on ``weights.<policy>``."""
    named = {col.policy_of(c.metric) for c in col.by_role("trainer")}
    return {p: col.trainer_step(p) if p in named else _published(col.bus, config.run, p)
            for p in config.policies}


def _published(bus: Any, run: str, policy: str) -> int:
    """The newest version published on ``weights.<policy>`` (0: none): the last manifest of
    each partition (a publisher's versions increase)."""
    from astraflow.core.errors import SchemaError
    from astraflow.core.records import WeightManifest, decode
    from astraflow.core.topics import topic_name

    topic = topic_name(run, "weights", policy)
    try:
        ends = bus.describe_topic(topic).end_offsets
    except BusError:
        return 0
    if not any(ends.values()):
        return 0
    reader = bus.reader(topic, start={p: max(0, e - 1) for p, e in ends.items()},
                        client_id="run-final-versions")
    newest = 0
    try:
        for msg in reader.consume(len(ends), 2.0):
            try:
                m = decode(msg.value, WeightManifest)
            except SchemaError:
                continue
            if isinstance(m, WeightManifest):
                newest = max(newest, m.version)
    finally:
        reader.close()
    return newest


def _evaluated(config: ExperimentConfig, col: Any, final: dict[str, int]) -> bool:
    """Has every evaluator reported a version at least ``final[policy]``?"""
    evs = col.evaluators()
    if not evs or not all(p in evs and evs[p].metric.gauges.get("eval_step", -1) >= step
                          for p, step in final.items()):
        return False
    if not _team_evaluated(config):
        return True
    team = col.team_evaluator()
    if team is None:
        return False
    g = team.metric.gauges
    return all(g.get(f"version.{p}", -1) >= final[p] for p in config.team().values()
               if p in final)


def export_final(config: ExperimentConfig, out: Path) -> dict[str, Path]:
    """Each trainer's newest checkpoint (where its ``trainer.checkpoint_dir`` puts it, under
    ``trainers.<policy>`` when the policy overrides it) as a Hugging Face model directory
    ``out/final/<policy>``; policies without one are left out."""
    exported: dict[str, Path] = {}
    for p in config.policies:
        tc = config.trainer_for(p)
        ck = newest_checkpoint(tc.checkpoint_root(out, p))
        if ck is not None:
            scale = tc.lora.alpha / tc.lora.r if tc.lora is not None else None  # LoRA: merged
            exported[p] = export_model(ck, model_dir(config, p, out), out / "final" / p,
                                       lora_scale=scale)
    return exported


def _finish(config: ExperimentConfig, out: Path, bus: Any, sup: Supervisor, console: Any,
            codes: dict[str, int | None], interrupted: bool, account: Any, plot_run: Any,
            summary: Any, spent: dict[str, Any] | None = None) -> int:
    from rich.table import Table

    export_final(config, out)
    metrics = out / "metrics.jsonl"
    plots = plot_run(metrics, out / "plots") if metrics.exists() else []
    result: dict[str, Any] = summary(metrics) if metrics.exists() else {}
    result["accounting"] = account(bus, config)
    result["roles"] = {n: {"exit": codes.get(n), "restarts": r.restarts,
                           "exit_codes": r.exit_codes} for n, r in sup.roles.items()}
    result["failed_roles"] = sup.failed
    result["interrupted"] = interrupted
    if spent:
        result["time"] = spent  # where every second went, per role (run/breakdown.py)
    if (out / "warmup.json").exists():  # where RL started and how the warm-up got there
        result["warmup"] = json.loads((out / "warmup.json").read_text())
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    table = Table(title=f"run {config.run}")
    table.add_column("")
    table.add_column("value", justify="right")
    for k in ("trainer_steps", "elapsed_s", "first_version_s", "eval_first", "eval_last",
              "eval_best", "episodes_per_s_mean", "wait_ratio_mean"):
        table.add_row(k, str(result.get(k)))
    from astraflow.run.breakdown import describe

    for role, row in (spent or {}).items():
        table.add_row(f"time {role}", describe(row))
    evals = result.get("eval", {})
    for p, e in evals.items() if len(evals) > 1 else ():
        table.add_row(f"eval {p} ({e['kind']}) first/last/best",
                      "/".join("-" if e[k] is None else f"{e[k]:.3f}"
                               for k in ("first", "last", "best")))
    if "system" in result:
        s = result["system"]
        table.add_row("team system_accuracy first/last/best",
                      "/".join("-" if s[k] is None else f"{s[k]:.3f}"
                               for k in ("first", "last", "best")))
    for p, w in result.get("warmup", {}).get("policies", {}).items():
        table.add_row(f"warm-up {p}", _landing(w))
    for k, v in result["accounting"].items():
        if k != "by_policy":
            table.add_row(f"trajectories: {k}", str(v))
    for p, counts in result["accounting"].get("by_policy", {}).items():
        table.add_row(f"trajectories of {p}", ", ".join(f"{k} {v}" for k, v in counts.items()
                                                       if v or k == "unaccounted"))
    console.print(table)
    console.print(f"run directory: {out}  (metrics.jsonl, logs/, plots/ {len(plots)} PNG, "
                  f"final/, summary.json)")
    return exits.run_code(sup.failed)


class _Null:
    def __enter__(self) -> _Null:
        return self

    def __exit__(self, *a: object) -> None:
        return None

    def update(self, *_: object) -> None:
        return None


def event_printer(console: Any) -> Callable[[str], None]:
    """Prints the supervisor's events in yellow, as text: an event quotes a role's log, whose
    brackets (``[rank0]:``, a path in ``[/...]``) are not rich markup (one such line used to
    end the whole run with a MarkupError)."""
    from rich.markup import escape

    return lambda msg: console.print(f"[yellow]{escape(msg)}[/]", highlight=False)
