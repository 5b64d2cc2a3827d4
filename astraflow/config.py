"""The experiment config: one YAML file describes an experiment (DESIGN.md §10).

Each subpackage owns the model of its section; this module only composes them. Load with
:func:`load_experiment` (unknown keys rejected, every problem reported at once, ``--set``
overrides applied).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic_core import InitErrorDetails, PydanticCustomError

from astraflow.consumers.rollout.config import RolloutConfig
from astraflow.consumers.scaler.config import ScaleConfig
from astraflow.consumers.trainer.config import TrainerConfig, with_overrides
from astraflow.core.bus.url import DEFAULT_URL
from astraflow.core.config import Section, load
from astraflow.core.errors import ConfigError
from astraflow.gateway.config import GatewayConfig
from astraflow.models.config import ModelConfig
from astraflow.policies.config import DataConfig
from astraflow.producers.config import ProducerConfig
from astraflow.weights.config import StoreConfig, WeightsConfig


class BusConfig(Section):
    """Where the topics live."""

    url: str = pydantic.Field(
        DEFAULT_URL,
        description="embedded:///path/bus.db or kafka://host:port[,host:port]; {out} is the "
                    "run directory")
    options: dict[str, str] = pydantic.Field(
        default_factory=dict, description="extra client settings (Kafka: SASL/SSL, ...)")
    partitions: dict[str, int] = pydantic.Field(
        default_factory=dict, description="partition count per logical topic, e.g. tasks: 8")
    claims: StoreConfig | None = pydantic.Field(
        StoreConfig(path="{out}/claims"),
        description="where records over the bus's message limit go by claim check (a long "
                    "agentic episode): a file or http store that producers and readers share "
                    "({out}: the run directory, so one host only); null: such records fail")


class PolicyWarmupConfig(Section):
    """One policy's own warm-up settings, laid over ``launch.warmup``'s (null: the shared
    value). A verifier measured by balanced judgement accuracy needs another band than a
    solver measured by answer accuracy."""

    target_accuracy: tuple[float, float] | None = pydantic.Field(
        None, description="[low, high] for this policy (its held-out measure: answer "
                          "accuracy, or for a verifier balanced judgement accuracy)")
    lr: float | None = pydantic.Field(None, gt=0, description="SFT learning rate")
    steps: int | None = pydantic.Field(None, ge=0, description="SFT steps (the cap with a band)")

    @pydantic.field_validator("target_accuracy")
    @classmethod
    def _band(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not 0.0 <= band[0] < band[1] <= 1.0:
            raise ValueError(f"target_accuracy {list(band)} must be [low, high] with "
                             "0 <= low < high <= 1")
        return band


class WarmupConfig(Section):
    """An SFT warm-up before RL: demonstrations (the producer's train split with its reference
    answers) go through the bus to the trainer in ``sft`` mode; RL starts from the result:
    after ``steps`` steps, or at the first check inside ``target_accuracy`` (see
    :mod:`astraflow.run.warmup`)."""

    steps: int = pydantic.Field(0, ge=0, description="SFT steps before RL (with "
                                                      "target_accuracy: the most); 0: none")
    batch_size: int = pydantic.Field(256, ge=1, description="demonstrations per SFT step")
    lr: float = pydantic.Field(2e-3, gt=0, description="SFT learning rate")
    grad_clip: float | None = pydantic.Field(None, gt=0,
                                             description="SFT gradient-norm clip; null: off")
    target_accuracy: tuple[float, float] | None = pydantic.Field(
        None, description="[low, high]: stop the warm-up at the first check whose held-out "
                          "greedy accuracy (launch.eval_problems of the producer's test split) "
                          "is inside this band, and start RL there; `steps` is then the cap. "
                          "null: exactly `steps` steps")
    check_every: int = pydantic.Field(
        10, ge=1, description="with target_accuracy: checkpoint and measure every N SFT steps")
    on_miss: Literal["error", "closest"] = pydantic.Field(
        "error", description="with target_accuracy, when no check was inside the band by "
                             "`steps`: error (the run fails, RL does not start) or closest "
                             "(RL starts from the check nearest the band, with a warning)")
    retry_every: int = pydantic.Field(
        4, ge=0, description="a solver_verifier team's solver also learns the retry protocol: "
                             "one retry demonstration (a rejected answer, the verifier's text, "
                             "the right answer) per N problems; 0: none")
    verifier_work: Literal["sum", "columns", "none"] = pydantic.Field(
        "sum", description="a solver_verifier team's verifier: what its demonstrations write "
                           "before the verdict line. sum: its own answer (\"46\\nno\"); "
                           "columns: an addition's column sums, units first, then its own "
                           "answer (\"2+9=11\\n1+3+1=5\\n51\\nno\"; producer.arithmetic.ops "
                           "[\"+\"] only; give the verifier room: role_sampling.verifier."
                           "max_new_tokens); none: the verdict alone")
    policies: dict[str, PolicyWarmupConfig] = pydantic.Field(
        default_factory=dict, description="per policy: its own target_accuracy, lr, steps "
                                          "(e.g. verifier: {target_accuracy: [0.6, 0.75]})")

    def band(self, policy: str) -> tuple[float, float] | None:
        """The target band of ``policy`` (its own, else the shared one)."""
        own = self.policies.get(policy)
        return own.target_accuracy if own and own.target_accuracy else self.target_accuracy

    def lr_of(self, policy: str) -> float:
        own = self.policies.get(policy)
        return own.lr if own and own.lr is not None else self.lr

    def steps_of(self, policy: str) -> int:
        own = self.policies.get(policy)
        return own.steps if own and own.steps is not None else self.steps

    @pydantic.model_validator(mode="after")
    def _band(self) -> WarmupConfig:
        if self.target_accuracy is None:
            return self
        low, high = self.target_accuracy
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"target_accuracy {[low, high]} must be [low, high] with "
                             "0 <= low < high <= 1, e.g. [0.2, 0.3]")
        # steps: 0 stays valid with a band: no warm-up at all (`--set launch.warmup.steps=0`
        # starts RL from a given model), so the band is moot
        return self


class LaunchConfig(Section):
    """How `astraflow run` lays the roles out on this host."""

    rollout_workers: int = pydantic.Field(2, ge=1, description="rollout processes")
    rollout_speeds: list[float] | None = pydantic.Field(
        None, description="per rollout process, its rollout.engine.speed (one per worker, "
        "in (0, 1]), e.g. [1.0, 0.6, 0.3]: workers standing in for GPUs of different speeds; "
        "rollout-<i> gets the i-th. Workers the scaler adds later run at rollout.engine.speed "
        "(or what their pool's actuator.rollout_args set); null: every worker at "
        "rollout.engine.speed")
    evaluate: bool = pydantic.Field(True, description="run the held-out evaluator")
    eval_problems: int = pydantic.Field(500, ge=1, description="held-out problems per eval")
    eval_samples: int = pydantic.Field(
        0, ge=0, le=64, description="answer evaluations (single_turn): also this many sampled "
        "completions per held-out problem at rollout.engine.temperature, reported as "
        "eval_sampled_accuracy (what RL's train reward estimates) and eval_pass_at_k; 0: "
        "greedy only")
    eval_device: str = pydantic.Field(
        "cpu", description="where the held-out evaluators run their model: cpu, cuda, "
        "cuda:1, ... (a GPU run's evaluator on its CPU would take hours for a 1B model)")
    eval_every: int = pydantic.Field(
        10, ge=1, description="evaluate every N weight versions (and always the last one)")
    eval_nice: int = pydantic.Field(
        10, ge=0, le=19, description="scheduling niceness added to the evaluator processes: "
        "they measure, and training should not share the cores with them on a full machine "
        "(0: the same priority as the training roles)")
    eval_temperature: float = pydantic.Field(
        0.0, ge=0.0, le=2.0, description="sampling temperature of the held-out evaluation of "
        "a multi-turn workflow (the evaluator's `episode` kind and the warm-up's checks): 0 is "
        "greedy; the rollout temperature measures the policy RL samples from (a tool call of "
        "~25 tokens can be right greedily long before a sample gets all of them right). "
        "Single-turn answers and verdicts are always greedy")
    restart: bool = pydantic.Field(True, description="restart a role that dies")
    max_restarts: int = pydantic.Field(3, ge=0, description="restarts per role")
    stop_grace_s: float = pydantic.Field(30.0, gt=0,
                                         description="SIGTERM → SIGKILL grace when stopping")
    threads_per_role: int | None = pydantic.Field(
        1, ge=1, description="OMP/MKL/torch threads per role process (many processes share "
                             "few cores); null: the libraries' defaults")
    timeout_s: float | None = pydantic.Field(
        None, gt=0, description="stop the RL phase after this long (the warm-up not counted)")
    stop_at_accuracy: float | None = pydantic.Field(
        None, gt=0, le=1, description="stop the RL phase once every evaluator has measured at "
                                      "least this held-out accuracy (needs evaluate: true); "
                                      "null: run to the step budget or timeout")
    metrics_port_base: int | None = pydantic.Field(
        None, ge=1024, le=65000,
        description="serve every RL-phase role's metrics for Prometheus on its own port, from "
                    "this one up (role i: base + i), and list them in "
                    "{out}/prometheus-targets.json (file_sd); null: no endpoints")
    warmup: WarmupConfig = WarmupConfig()

    @pydantic.field_validator("rollout_speeds")
    @classmethod
    def _speeds(cls, speeds: list[float] | None,
                info: pydantic.ValidationInfo) -> list[float] | None:
        if speeds is None:
            return None
        problems = [f"[{i}] = {v!r} is not in (0, 1]" for i, v in enumerate(speeds)
                    if not 0 < v <= 1]
        n = info.data.get("rollout_workers")
        if n is not None and len(speeds) != n:
            problems.append(f"{len(speeds)} speed(s) for launch.rollout_workers = {n}: give one "
                            "per worker, or null for rollout.engine.speed everywhere")
        if problems:
            raise ValueError("; ".join(problems))
        return speeds

    def rollout_speed(self, worker: int) -> float | None:
        """The engine speed of `astraflow run`'s rollout worker number ``worker`` (None: the
        config's rollout.engine.speed)."""
        speeds = self.rollout_speeds
        return speeds[worker] if speeds is not None and worker < len(speeds) else None

    @pydantic.model_validator(mode="after")
    def _stop_needs_eval(self) -> LaunchConfig:
        if self.stop_at_accuracy is not None and not self.evaluate:
            raise ValueError("stop_at_accuracy needs the evaluator: set evaluate: true or "
                             "stop_at_accuracy: null")
        return self


class ExperimentConfig(Section):
    """An experiment: its run name, bus, trainable policies and every role's section."""

    run: str = pydantic.Field("quickstart", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                              description="run name; topics are af.<run>.<name>")
    seed: int = 0
    policies: list[str] = pydantic.Field(["default"], min_length=1,
                                         description="trainable policies (roles)")
    bus: BusConfig = BusConfig()
    models: dict[str, ModelConfig] = pydantic.Field(
        default_factory=dict, description="per policy; a policy absent here gets the defaults")
    producer: ProducerConfig = ProducerConfig()
    rollout: RolloutConfig = RolloutConfig()
    data: DataConfig = DataConfig()
    trainer: TrainerConfig = TrainerConfig()
    trainers: dict[str, dict[str, Any]] = pydantic.Field(
        default_factory=dict,
        description="per policy: a partial trainer section deep-merged over `trainer`, e.g. "
                    "verifier: {optimizer: {lr: 1.0e-5}}; each result is checked as a whole "
                    "trainer section; a policy absent here trains with `trainer`")
    weights: WeightsConfig = WeightsConfig()
    launch: LaunchConfig = LaunchConfig()
    scale: ScaleConfig = ScaleConfig()
    gateway: GatewayConfig = GatewayConfig()

    def model(self, policy: str) -> ModelConfig:
        """The model section of ``policy`` (the defaults when ``models`` does not name it)."""
        return self.models.get(policy) or ModelConfig()

    def team(self) -> dict[str, str]:
        """Role -> policy of the run's multi-policy workflow (the one tasks use:
        ``producer.workflow``, else ``rollout.workflow.default``): each role of its reward
        contract, mapped by the workflow's ``policies`` kwarg, else the role's own name.
        Empty for a single-policy workflow (``single_turn``, ...)."""
        workflow = self.team_workflow()
        if workflow is None:
            return {}
        from astraflow.consumers.rollout.workflows.contracts import CONTRACTS

        mapped = self.team_kwargs().get("policies") or {}
        return {role: str(mapped.get(role, role)) for role in CONTRACTS[workflow].roles}

    def team_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the run's multi-policy workflow
        (``rollout.workflow.kwargs.<workflow>``; empty when there is none or it has none)."""
        workflow = self.team_workflow()
        return {} if workflow is None else self.rollout.workflow.kwargs.get(workflow, {})

    def workflow(self) -> str:
        """The workflow the run's tasks use: ``producer.workflow``, else (when that is the
        default ``single_turn``) ``rollout.workflow.default``."""
        return (self.producer.workflow if self.producer.workflow != "single_turn"
                else self.rollout.workflow.default)

    def workflow_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`workflow` (``rollout.workflow.kwargs.<name>``)."""
        return dict(self.rollout.workflow.kwargs.get(self.workflow(), {}))

    def team_workflow(self) -> str | None:
        """The name of the run's multi-policy workflow (one with a registered reward
        contract), or None."""
        from astraflow.consumers.rollout.workflows.contracts import CONTRACTS

        name = self.workflow()
        return name if name in CONTRACTS else None

    def role_of(self, policy: str) -> str | None:
        """The team role ``policy`` plays (the first, if it plays several), or None."""
        return next((r for r, p in self.team().items() if p == policy), None)

    def trainer_for(self, policy: str) -> TrainerConfig:
        """The effective trainer section of ``policy``: ``trainers.<policy>`` laid over
        ``trainer`` (``trainer`` itself when ``trainers`` does not name the policy)."""
        override = self.trainers.get(policy)
        if not override:
            return self.trainer
        try:
            return with_overrides(self.trainer, override)
        except pydantic.ValidationError as e:  # trainer changed after loading
            raise ConfigError([f"trainers.{policy}.{'.'.join(map(str, err['loc']))}: "
                               f"{err['msg']}" for err in e.errors()]) from None

    @pydantic.field_validator("models")
    @classmethod
    def _known_policies(cls, models: dict[str, ModelConfig],
                        info: pydantic.ValidationInfo) -> dict[str, ModelConfig]:
        """A per-policy key must name a policy of ``policies`` (a typo would otherwise be
        silently ignored and the policy given the defaults)."""
        _refuse(_unknown(models, info.data.get("policies")))
        return models

    @pydantic.field_validator("launch")
    @classmethod
    def _known_warmup_policies(cls, launch: LaunchConfig,
                               info: pydantic.ValidationInfo) -> LaunchConfig:
        _refuse(_unknown(launch.warmup.policies, info.data.get("policies"),
                         ("warmup", "policies")))
        return launch

    @pydantic.field_validator("data")
    @classmethod
    def _known_data_policies(cls, data: DataConfig,
                             info: pydantic.ValidationInfo) -> DataConfig:
        policies = info.data.get("policies")
        primary = [data.primary_policy] if data.primary_policy is not None else []
        _refuse(_unknown(data.batch_sizes, policies, ("batch_sizes",))
                + _unknown(data.max_staleness_per_policy, policies,
                           ("max_staleness_per_policy",))
                + _unknown(primary, policies, ("primary_policy",), keyed=False))
        return data

    @pydantic.field_validator("scale")
    @classmethod
    def _known_pool_policies(cls, scale: ScaleConfig,
                             info: pydantic.ValidationInfo) -> ScaleConfig:
        policies = info.data.get("policies")
        _refuse([e for name, pool in scale.pools.items()
                 for e in _unknown(pool.policies, policies, ("pools", name, "policies"),
                                   keyed=False)])
        return scale

    @pydantic.field_validator("gateway")
    @classmethod
    def _known_gateway_policies(cls, gateway: GatewayConfig,
                                info: pydantic.ValidationInfo) -> GatewayConfig:
        policies = info.data.get("policies")
        _refuse(_unknown(gateway.policies or [], policies, ("policies",), keyed=False)
                + [e for alias, p in gateway.aliases.items()
                   for e in _unknown([p], policies, ("aliases", alias), keyed=False)])
        return gateway

    @pydantic.field_validator("trainers")
    @classmethod
    def _whole_trainer_sections(cls, trainers: dict[str, dict[str, Any]],
                                info: pydantic.ValidationInfo) -> dict[str, dict[str, Any]]:
        """Each policy's merged section is validated now, so a bad override fails at load
        time with its path (``trainers.<policy>.<key>``), every problem at once; so is a key
        that names no policy."""
        errors = _unknown(trainers, info.data.get("policies"))
        base = info.data.get("trainer")
        for policy, override in trainers.items():
            if base is None:  # `trainer` is invalid and reported; a merge would only echo it
                break
            try:
                with_overrides(base, override)
            except pydantic.ValidationError as e:
                errors += [InitErrorDetails(type=_trainer_error(err),
                                            loc=(policy, *err["loc"]), input=err["input"])
                           for err in e.errors()]
        _refuse(errors)
        return trainers

    @pydantic.model_validator(mode="after")
    def _team_policies(self) -> ExperimentConfig:
        """Every role of the run's multi-policy workflow is played by a policy of ``policies``
        (refused at load time, at the key that names it, rather than by every rollout worker
        at its first task); a ``policies`` mapping naming no role is refused too."""
        workflow = self.team_workflow()
        if workflow is None:
            return self
        from astraflow.consumers.rollout.workflows.contracts import CONTRACTS

        roles = CONTRACTS[workflow].roles
        where = ("rollout", "workflow", "kwargs", workflow, "policies")
        mapped = self.team_kwargs().get("policies") or {}
        if not isinstance(mapped, dict):
            _refuse([InitErrorDetails(type=_error("bad_mapping", "a mapping role -> policy"),
                                      loc=where, input=mapped)])
        errors = [InitErrorDetails(
            type=_error("unknown_role", f"workflow {workflow!r} has no role {role!r}; roles: "
                                        f"{', '.join(roles)}"), loc=(*where, role), input=role)
            for role in mapped if role not in roles]
        latency = self.team_kwargs().get("verifier_latency")
        if latency is not None:  # refused at load time, not by every episode
            from astraflow.consumers.rollout.latency import parse_latency

            try:
                parse_latency(latency, where="verifier_latency")
            except ConfigError as e:
                errors.append(InitErrorDetails(
                    type=_error("bad_latency", "; ".join(e.problems)),
                    loc=("rollout", "workflow", "kwargs", workflow, "verifier_latency"),
                    input=latency))
        for role, policy in self.team().items():
            if policy in self.policies:
                continue
            loc = (*where, role) if role in mapped else ("policies",)
            errors.append(InitErrorDetails(type=_error(
                "role_without_policy",
                f"workflow {workflow!r} role {role!r} is played by policy {policy!r}, which is "
                f"not in policies ({', '.join(self.policies)}): add it to policies, or map "
                f"the role with rollout.workflow.kwargs.{workflow}.policies.{role}"),
                loc=loc, input=policy))
        _refuse(errors)
        return self

    @pydantic.model_validator(mode="after")
    def _verifier_work(self) -> ExperimentConfig:
        """Column work is an addition's: refused at load time for other operators."""
        if self.launch.warmup.verifier_work != "columns":
            return self
        ops = self.producer.arithmetic.ops
        if self.producer.source != "arithmetic" or set(ops) != {"+"}:
            _refuse([InitErrorDetails(type=_error(
                "columns_need_addition", "verifier_work columns writes an addition's column "
                f"sums: it needs producer.source arithmetic with ops ['+'] (here "
                f"{self.producer.source!r}, ops {list(ops)}); use sum or none"),
                loc=("launch", "warmup", "verifier_work"), input="columns")])
        return self

    @pydantic.model_validator(mode="after")
    def _eval_temperature(self) -> ExperimentConfig:
        """A sampled evaluation is the ``episode`` kind's only (multi-turn workflows)."""
        if self.launch.eval_temperature > 0 and (self.workflow() == "single_turn"
                                                 or self.team_workflow() is not None):
            _refuse([InitErrorDetails(type=_error(
                "greedy_only", f"workflow {self.workflow()!r} is evaluated greedily (its "
                "answers or verdicts); eval_temperature applies to a multi-turn workflow's "
                "episodes (e.g. multi_turn_tools): set it to 0"),
                loc=("launch", "eval_temperature"), input=self.launch.eval_temperature)])
        return self

    @pydantic.model_validator(mode="after")
    def _train_on_train(self) -> ExperimentConfig:
        """The producer releasing arithmetic's test split would train on what the evaluator
        measures: refused while the run evaluates or warms up to a band."""
        pc = self.producer
        if pc.source == "arithmetic" and pc.arithmetic.split == "test" and (
                self.launch.evaluate or self.launch.warmup.target_accuracy is not None):
            _refuse([InitErrorDetails(type=_error(
                "trains_on_held_out", "the producer would release the held-out problems the "
                "evaluator measures: keep split: train, or set launch.evaluate: false"),
                loc=("producer", "arithmetic", "split"), input="test")])
        return self

    @pydantic.model_validator(mode="after")
    def _sampled_eval(self) -> ExperimentConfig:
        """Sampled evaluation draws at the rollout temperature: refused at 0 (greedy)."""
        if self.launch.eval_samples and self.rollout.engine.temperature <= 0:
            _refuse([InitErrorDetails(type=_error(
                "greedy_samples", "eval_samples draws replies at rollout.engine.temperature, "
                "which is 0 (greedy): every sample would be the greedy reply; set "
                "eval_samples: 0 or a temperature"),
                loc=("launch", "eval_samples"), input=self.launch.eval_samples)])
        return self

    @pydantic.model_validator(mode="after")
    def _tool_latency(self) -> ExperimentConfig:
        """A bad ``multi_turn_tools.tool_latency`` is refused at load time, at its key, rather
        than by every episode."""
        kw = self.rollout.workflow.kwargs.get("multi_turn_tools") or {}
        if kw.get("tool_latency") is None:
            return self
        from astraflow.consumers.rollout.workflows.multi_turn import parse_tool_latency

        where = ("rollout", "workflow", "kwargs", "multi_turn_tools", "tool_latency")
        try:
            parse_tool_latency(kw["tool_latency"], ".".join(where))
        except ConfigError as e:
            _refuse([InitErrorDetails(type=_error("bad_latency", "; ".join(e.problems)),
                                      loc=where, input=kw["tool_latency"])])
        return self

    @pydantic.model_validator(mode="after")
    def _one_group_size(self) -> ExperimentConfig:
        """The samples per task are one number, ``producer.n_samples``: the assembler's
        fallback for trajectories that do not carry it follows it unless set."""
        if self.data.assembler.group_size is None:
            self.data.assembler.group_size = self.producer.n_samples
        return self


def _unknown(value: Iterable[str], policies: list[str] | None, where: tuple[str, ...] = (),
             *, keyed: bool = True) -> list[InitErrorDetails]:
    """One error per name in ``value`` (a mapping's keys, located under ``where`` + the key;
    with ``keyed=False`` plain values, located at ``where``) that is not a policy; none when
    ``policies`` itself failed validation."""
    if policies is None:
        return []
    return [InitErrorDetails(
        type=_error("unknown_policy", f"unknown policy {name!r}; valid (policies): "
                                      f"{', '.join(policies)}; add it to policies or fix the "
                                      "name"),
        loc=(*where, name) if keyed else where, input=name)
        for name in value if name not in policies]


def _trainer_error(err: Any) -> PydanticCustomError:
    """An error inside a merged trainer section; an unknown key lists the valid ones (the
    generic hint cannot walk into ``trainers``' free-form dicts)."""
    if err["type"] != "extra_forbidden":
        return _error(err["type"], err["msg"])
    section: Any = TrainerConfig
    for part in err["loc"][:-1]:
        section = section.model_fields[part].annotation
    return _error("unknown_key", f"unknown key; valid keys here: "
                                 f"{', '.join(sorted(section.model_fields))}")


def _error(kind: str, message: str) -> PydanticCustomError:
    # the message is final text: braces in it are escaped from the template formatting
    return PydanticCustomError(kind, message.replace("{", "{{").replace("}", "}}"))


def _refuse(errors: list[InitErrorDetails]) -> None:
    # a ValidationError raised in a field validator keeps its line errors, each located
    # under the field, so every bad key is reported at once with its own path
    if errors:
        raise pydantic.ValidationError.from_exception_data("ExperimentConfig", errors)


def load_experiment(path: str | Path | None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    return load(ExperimentConfig, path, overrides)
