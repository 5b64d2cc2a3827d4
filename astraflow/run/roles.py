"""Each role built from the experiment config: the one place that hands a role its own section
plus the few values it shares with the run (name, policies, models, run directory, seed).

Roles never see :class:`~astraflow.config.ExperimentConfig` (an import-linter contract in
pyproject.toml): ``configured_x(config, ...)`` builds what the role's own
``build_x(section, ...)`` builds, and ``run_configured_x(config, ...)`` runs it. Heavy imports
(torch) happen inside each function.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.config import ExperimentConfig
from astraflow.core.errors import ConfigError
from astraflow.run.resources import create_run_topics, model_dir, open_bus

if TYPE_CHECKING:
    from astraflow.consumers.evaluator import Evaluator
    from astraflow.consumers.rollout.engines.base import Engine
    from astraflow.consumers.rollout.worker import RolloutWorker, WorkerStats
    from astraflow.consumers.team_evaluator import TeamEvaluator
    from astraflow.consumers.trainer.loop import Trainer
    from astraflow.core.bus.types import Bus
    from astraflow.core.claims import BlobStore
    from astraflow.gateway.service import Gateway
    from astraflow.models.config import ModelConfig
    from astraflow.policies.runner import StageRunner
    from astraflow.producers.producer import ProduceStats
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.sharded import ShardedPublisher


def claims(config: ExperimentConfig, out: str | Path) -> BlobStore | None:
    """The claim store of the run (``bus.claims``), or None where claim checks are off."""
    if config.bus.claims is None:
        return None
    from astraflow.weights.config import build_store

    return build_store(config.bus.claims, out)


def models(config: ExperimentConfig) -> dict[str, ModelConfig]:
    """Every policy's model section (the defaults where ``models`` does not name it)."""
    return {p: config.model(p) for p in config.policies}


# trainer -------------------------------------------------------------------------------------

def configured_trainer(config: ExperimentConfig, policy: str, out: str | Path, *, bus: Bus,
                       publisher: Publisher | None = None, metrics: Any = None) -> Trainer:
    """The trainer of ``policy`` (its model built first when the config asks for a tiny
    one)."""
    from astraflow.consumers.trainer.build import build_trainer as build

    if policy not in config.policies:
        raise ConfigError(f"unknown policy {policy!r}; valid: {', '.join(config.policies)}")
    return build(config.trainer_for(policy), config.model(policy), run=config.run,
                 policy=policy, out=out, bus=bus, publisher=publisher, metrics=metrics,
                 claims=claims(config, out), limits=config.data.records.limits())


def configured_publisher(config: ExperimentConfig, policy: str, out: str | Path,
                         bus: Bus) -> Publisher:
    """The weights publisher of ``policy`` as the ``weights`` section describes it."""
    from astraflow.weights.config import build_publisher as build

    return build(bus, config.weights, run=config.run, policy=policy, out=out)


def configured_rank_publisher(config: ExperimentConfig, policy: str, out: str | Path, bus: Bus,
                              *, rank: int, world: int) -> ShardedPublisher:
    """Rank ``rank``'s publisher of a sharded (``trainer.parallel: fsdp``) trainer: every
    rank publishes the rows it owns, rank 0 sends the manifests (docs/weights.md)."""
    from astraflow.weights.config import build_sharded_publisher

    return build_sharded_publisher(bus, config.weights, run=config.run, policy=policy,
                                   rank=rank, world_size=world, out=out)


# rollout -------------------------------------------------------------------------------------

def configured_engines(config: ExperimentConfig, out: str | Path = ".") -> dict[str, Engine]:
    """One rollout engine per hosted policy."""
    from astraflow.consumers.rollout.service import build_engines as build

    return build(config.rollout, policies=config.policies, models=models(config), out=out)


def drain_bounds(config: ExperimentConfig) -> dict[str, int] | None:
    """The staleness bound per policy that the run's staleness filter drops groups by, so a
    draining worker releases the tasks it would drop; None when the run has no such stage."""
    data = config.data
    if "staleness" not in (*data.post_rollout, *data.batch):
        return None
    return {p: data.max_staleness_of(p, data.staleness.max_staleness) for p in config.policies}


def configured_worker(config: ExperimentConfig, out: str | Path = ".", *, bus: Bus,
                      engines: dict[str, Engine] | None = None,
                      worker_id: str | None = None) -> RolloutWorker:
    """A rollout worker on ``bus`` (whose topics exist); draining, it releases the tasks the
    run's staleness filter would drop (when the run has one)."""
    from astraflow.consumers.rollout.service import build_worker as build

    return build(config.rollout, run=config.run, policies=config.policies,
                 models=models(config), weights=config.weights, out=out, bus=bus,
                 engines=engines, worker_id=worker_id, claims=claims(config, out),
                 drain_max_staleness=drain_bounds(config))


def run_configured_worker(config: ExperimentConfig, out: str | Path = ".", *,
                          max_tasks: int | None = None, timeout: float | None = None,
                          should_stop: Callable[[], bool] | None = None,
                          worker_id: str | None = None,
                          on_ready: Callable[[RolloutWorker], None] | None = None
                          ) -> WorkerStats:
    """``astraflow rollout``: open the run's bus (creating its topics), run a worker until
    stopped (draining as :func:`configured_worker`'s does), close everything."""
    from astraflow.consumers.rollout.service import run_worker as run

    bus = open_bus(config, out)
    try:
        return run(config.rollout, run=config.run, policies=config.policies,
                   models=models(config), weights=config.weights, out=out, bus=bus,
                   max_tasks=max_tasks, timeout=timeout, should_stop=should_stop,
                   worker_id=worker_id, on_ready=on_ready, claims=claims(config, out),
                   drain_max_staleness=drain_bounds(config))
    finally:
        bus.close()


# policies ------------------------------------------------------------------------------------

def vocab_sizes(config: ExperimentConfig, out: str | Path = ".") -> dict[str, int]:
    """Policy -> the vocabulary size of its model (``vocab_size`` of its config.json): what the
    post-rollout stage checks token ids against. A policy whose model cannot be had here (a
    hub id with no hub reachable) is left out, with a warning: its ids are only checked to be
    >= 0, and the trainer still checks them against the model it loaded."""
    import json
    import logging

    sizes: dict[str, int] = {}
    for p in config.policies:
        try:
            cfg = json.loads((model_dir(config, p, out) / "config.json").read_text())
            text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
            sizes[p] = int(text["vocab_size"])
        except (ConfigError, OSError, ValueError, KeyError, TypeError) as e:
            logging.getLogger("astraflow.run").warning(
                "policy=%s: no vocabulary size to check token ids against (%s)", p, e)
    return sizes


def configured_checkpoint_path(config: ExperimentConfig, stage: str, policy: str | None,
                               out: str | Path = ".") -> Path:
    """Where the ``stage`` processor (of ``policy``, for the batch stage) checkpoints."""
    from astraflow.policies.stage import checkpoint_path as path

    return path(config.data, stage, policy, run=config.run, out=out)


def configured_runner(config: ExperimentConfig, stage: str, *, policy: str | None = None,
                      out: str | Path = ".", bus: Bus) -> StageRunner:
    """The runner of ``stage`` on ``bus`` (whose topics exist)."""
    from astraflow.policies.stage import build_runner as build

    return build(config.data, stage, run=config.run, policies=config.policies,
                 seed=config.seed, policy=policy, out=out, bus=bus, claims=claims(config, out),
                 rollout_group=config.rollout.group_for(config.run),
                 vocab=vocab_sizes(config, out) if stage == "post_rollout" else None)


def run_configured_stage(config: ExperimentConfig, stage: str, *, policy: str | None = None,
                         out: str | Path = ".", bus: Bus | None = None,
                         max_records: int | None = None, timeout: float | None = None,
                         should_stop: Callable[[], bool] | None = None) -> dict[str, float]:
    """``astraflow policy``: run one stage processor until ``max_records`` main input records,
    ``timeout`` seconds or ``should_stop()``; returns its counters. Opens the run's bus unless
    ``bus`` is given; the run's topics are created either way."""
    from astraflow.policies.stage import run_stage as run

    own = bus is None
    if bus is None:
        bus = open_bus(config, out)
    else:
        create_run_topics(config, bus)
    try:
        return run(config.data, stage, run=config.run, policies=config.policies,
                   seed=config.seed, policy=policy, out=out, bus=bus, max_records=max_records,
                   timeout=timeout, should_stop=should_stop, claims=claims(config, out),
                   rollout_group=config.rollout.group_for(config.run),
                   vocab=vocab_sizes(config, out) if stage == "post_rollout" else None)
    finally:
        if own:
            bus.close()


# evaluator -----------------------------------------------------------------------------------

def configured_evaluator(config: ExperimentConfig, policy: str, out: str | Path, *, bus: Bus,
                         metrics: Any = None) -> Evaluator:
    """The held-out evaluator of ``policy`` (``launch.eval_problems`` problems): its
    judgement of right and wrong claims when it plays the ``verifier`` role of a
    ``solver_verifier`` team (prompted as the run's workflow prompts it), else its answers."""
    from astraflow.consumers.evaluator import Evaluator
    from astraflow.consumers.rollout.rewards.sandbox import configure

    configure(allow_same_uid=config.rollout.sandbox.allow_same_uid)  # it runs the reward too
    if policy not in config.policies:
        raise ConfigError(f"unknown policy {policy!r}; valid: {', '.join(config.policies)}")
    kind = evaluation_kind(config, policy)
    prompt = None
    max_new_tokens = config.rollout.engine.max_new_tokens
    if kind == "verdict":
        prompt, max_new_tokens = verifier_turn(config)
    return Evaluator(run=config.run, policy=policy, model=config.model(policy),
                     producer=config.producer, reward=config.rollout.reward,
                     max_new_tokens=max_new_tokens,
                     weights=config.weights, out=out, bus=bus,
                     limit=config.launch.eval_problems, metrics=metrics,
                     kind=kind, verifier_prompt=prompt, seed=config.seed,
                     workflow=config.workflow(), workflow_kwargs=config.workflow_kwargs(),
                     temperature=config.launch.eval_temperature,
                     samples=config.launch.eval_samples if kind == "answer" else 0,
                     sample_temperature=config.rollout.engine.temperature,
                     sample_top_p=config.rollout.engine.top_p,
                     device=config.launch.eval_device)


#: workflows whose answer is one completion of the prompt (measured by ``answer``)
ONE_TURN = ("single_turn",)


def evaluation_kind(config: ExperimentConfig, policy: str) -> str:
    """How ``policy`` is measured (the evaluator's and the warm-up's kinds): ``verdict`` for a
    ``solver_verifier`` team's verifier, ``episode`` for a single-policy run whose workflow
    takes several turns (tool calls before the answer), else ``answer``."""
    if config.team_workflow() is not None:
        return "verdict" if (config.team_workflow() == "solver_verifier"
                             and config.role_of(policy) == "verifier") else "answer"
    return "answer" if config.workflow() in ONE_TURN else "episode"


def verifier_turn(config: ExperimentConfig) -> tuple[str, int]:
    """How the run's ``solver_verifier`` workflow prompts and samples its verifier: the prompt
    template (its ``verifier_prompt``, else the workflow's default) and the turn's
    ``max_new_tokens`` (the verifier's ``role_sampling`` override, the workflow's shared one,
    the engine's). Every measurement of a verifier (evaluator, warm-up checks, benchmarks)
    prompts it this way."""
    from astraflow.consumers.rollout.workflows.solver_verifier import VERIFIER_PROMPT

    kwargs = config.team_kwargs()
    own = (kwargs.get("role_sampling") or {}).get("verifier") or {}
    max_new_tokens = int(own.get("max_new_tokens", kwargs.get(
        "max_new_tokens", config.rollout.engine.max_new_tokens)))
    return str(kwargs.get("verifier_prompt") or VERIFIER_PROMPT), max_new_tokens


def configured_team_evaluator(config: ExperimentConfig, out: str | Path, *, bus: Bus,
                              metrics: Any = None) -> TeamEvaluator:
    """The evaluator of the run's ``solver_verifier`` team (every policy of it, the whole
    episode, greedy, on ``launch.eval_problems`` held-out problems)."""
    from astraflow.consumers.rollout.rewards.sandbox import configure
    from astraflow.consumers.team_evaluator import WORKFLOW, TeamEvaluator

    configure(allow_same_uid=config.rollout.sandbox.allow_same_uid)  # it runs the reward too
    if config.team_workflow() != WORKFLOW:
        raise ConfigError(f"the team evaluator measures a {WORKFLOW} team; this run's "
                          f"workflow is {config.team_workflow() or config.producer.workflow!r} "
                          f"(set producer.workflow: {WORKFLOW})")
    team = config.team()
    return TeamEvaluator(run=config.run, team=team,
                         models={p: config.model(p) for p in team.values()},
                         producer=config.producer, reward=config.rollout.reward,
                         max_new_tokens=config.rollout.engine.max_new_tokens,
                         weights=config.weights, out=out, bus=bus,
                         limit=config.launch.eval_problems,
                         workflow_kwargs=config.team_kwargs(),
                         metrics=metrics)


# producer ------------------------------------------------------------------------------------

def run_configured_producer(config: ExperimentConfig, out: str | Path = ".", *,
                            max_tasks: int | None = None,
                            should_stop: Callable[[], bool] | None = None) -> ProduceStats:
    """``astraflow produce``: open the run's bus (creating its topics), produce the
    ``producer`` section's tasks, report to ``metrics``, close."""
    from astraflow.core.topics import group_name
    from astraflow.producers.producer import produce as run

    reader = (group_name(config.run, "policy", stage="pre_rollout")
              if config.producer.topic == "tasks.raw" else config.rollout.group_for(config.run))
    bus = open_bus(config, out)
    try:
        return run(bus, config.producer, run=config.run, out=out, max_tasks=max_tasks,
                   should_stop=should_stop, reader=reader)
    finally:
        bus.close()


# reporter and scaler ---------------------------------------------------------------------------

def reporter_settings(config: ExperimentConfig) -> Any:
    """What the reporter needs of the experiment: B and the staleness bound per policy, the
    group size, the rollout group, the ``scale`` section's window and heartbeat timeout."""
    from astraflow.policies.reporter import ReporterSettings

    s = config.scale
    return ReporterSettings(
        run=config.run, policies=list(config.policies),
        batch_groups={p: config.data.batch_size_of(p) for p in config.policies},
        max_staleness={p: config.data.max_staleness_of(p) for p in config.policies},
        group_size=config.producer.n_samples,
        rollout_group=config.rollout.group_for(config.run), every_steps=s.report_every_steps,
        every_s=s.report_every_s, heartbeat_timeout_s=s.heartbeat_timeout_s,
        min_window_s=s.min_window_s)


def run_configured_reporter(config: ExperimentConfig, out: str | Path = ".", *,
                            max_reports: int | None = None, timeout: float | None = None,
                            should_stop: Callable[[], bool] | None = None) -> list[Any]:
    """``astraflow report``: open the run's bus (creating its topics) and write load reports
    until stopped."""
    from astraflow.policies.reporter import run_reporter as run

    bus = open_bus(config, out)
    try:
        return run(bus, reporter_settings(config), max_reports=max_reports, timeout=timeout,
                   should_stop=should_stop)
    finally:
        bus.close()


def pool_batch_groups(config: ExperimentConfig) -> dict[str, int]:
    """Per scaling pool, the largest B (groups per batch) of the policies it feeds."""
    return {name: max(config.data.batch_size_of(p) for p in (pool.policies or config.policies))
            for name, pool in config.scale.pools.items()}


class ScalerRole:
    """The scaler on ``bus``: its processor, metrics and one actuator per pool — those given
    in ``actuators`` (`astraflow run` gives its supervisor for the local pool), the rest
    built from each pool's ``actuator`` section. :meth:`run` as often as wanted, then
    :meth:`close` (which closes the actuators too)."""

    def __init__(self, config: ExperimentConfig, bus: Bus, config_path: str | Path,
                 out: str | Path = ".", *, actuators: dict[str, Any] | None = None,
                 poll_timeout: float = 0.5) -> None:
        from astraflow.consumers.scaler.actuators import build_actuator
        from astraflow.consumers.scaler.scaler import Scaler, scaler_processor
        from astraflow.core.metrics import MetricsEmitter

        given = actuators or {}
        self.actuators = {name: given[name] if name in given else build_actuator(
            pool.actuator, run=config.run, pool=name, config_path=str(config_path),
            out=str(out)) for name, pool in config.scale.pools.items()}
        self.metrics = MetricsEmitter(bus, run=config.run, role="scaler")
        self.scaler = Scaler(config.scale, self.actuators,
                             batch_groups=pool_batch_groups(config), metrics=self.metrics,
                             log_path=Path(out) / "scaler.jsonl")
        self.proc = scaler_processor(bus, self.scaler, run=config.run,
                                     poll_timeout=poll_timeout)

    def run(self, max_reports: int | None = None, timeout: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> list[dict[str, Any]]:
        """Handle reports until ``max_reports``, ``timeout`` or ``should_stop()``; returns
        every decision so far."""
        self.proc.run(max_reports, timeout, should_stop)
        return self.scaler.decisions

    def close(self) -> None:
        self.proc.close()
        self.scaler.close()
        self.metrics.close()
        for a in self.actuators.values():
            a.close()


def run_configured_scaler(config: ExperimentConfig, config_path: str | Path,
                          out: str | Path = ".", *, max_reports: int | None = None,
                          timeout: float | None = None,
                          should_stop: Callable[[], bool] | None = None
                          ) -> list[dict[str, Any]]:
    """``astraflow scale``: the scaler as a process of its own, each pool acting through the
    actuator its config names (``local``: `astraflow rollout` processes this process starts
    and stops). Returns the decisions."""
    bus = open_bus(config, out)
    try:
        role = ScalerRole(config, bus, config_path, out)
        try:
            return role.run(max_reports, timeout, should_stop)
        finally:
            role.close()
    finally:
        bus.close()


# gateway -------------------------------------------------------------------------------------

def configured_gateway(config: ExperimentConfig, out: str | Path = ".", *, bus: Bus,
                       policy: str | None = None, engines: dict[str, Engine] | None = None,
                       follow_weights: bool | None = None) -> Gateway:
    """The agent gateway of the run on ``bus`` (whose topics exist): ``policy`` alone, or
    the policies ``gateway.policies`` names (default: the rollout workers')."""
    from astraflow.gateway.build import build_gateway as build

    return build(config.gateway, config.rollout, run=config.run, policies=config.policies,
                 models=models(config), weights=config.weights, bus=bus, out=out, only=policy,
                 engines=engines, claims=claims(config, out), follow_weights=follow_weights)


def gateway_exposure(config: ExperimentConfig, host: str | None = None
                     ) -> tuple[str | None, str]:
    """The gateway's token and host; refuses (ConfigError) a non-loopback host with no
    credential unless ``gateway.allow_unauthenticated`` (warns on loopback)."""
    import os

    from astraflow.gateway.auth import TOKEN_ENV, check_exposure

    gc = config.gateway
    token = gc.token or os.environ.get(TOKEN_ENV) or None
    host = host or gc.host
    check_exposure(host, authenticated=bool(token or gc.keys),
                   allow_unauthenticated=gc.allow_unauthenticated)
    return token, host


def serve_gateway(config: ExperimentConfig, out: str | Path = ".", *,
                  policy: str | None = None, host: str | None = None,
                  port: int | None = None) -> None:
    """``astraflow serve``: open the run's bus (creating its topics), serve the gateway until
    SIGINT/SIGTERM, close everything."""
    from astraflow.gateway.auth import protect
    from astraflow.gateway.limits import limits_of
    from astraflow.gateway.server import app_for, serve

    gc = config.gateway
    token, host = gateway_exposure(config, host)  # before loading anything
    bus = open_bus(config, out)
    try:
        gateway = configured_gateway(config, out, bus=bus, policy=policy)
        try:
            limits = limits_of(gc)
            serve(protect(app_for(gateway, limits=limits), token=token, keys=gc.keys),
                  host=host, port=gc.port if port is None else port, limits=limits)
        finally:
            for engine in gateway.engines.values():
                engine.close()
    finally:
        bus.close()
