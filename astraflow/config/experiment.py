"""The experiment: one model composing every section (docs/config.md), and
:func:`load_experiment`.

Field errors and cross-section errors (:mod:`astraflow.config.checks`) are reported together:
one load lists every problem of the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pydantic
from pydantic_core import InitErrorDetails

from astraflow.config.checks import again, problems, refuse, trainer_error, unknown
from astraflow.config.metrics import MetricsConfig
from astraflow.config.sections import BusConfig, LaunchConfig
from astraflow.consumers.rollout.config import RolloutConfig
from astraflow.consumers.scaler.config import ScaleConfig
from astraflow.consumers.trainer.config import TrainerConfig, with_overrides
from astraflow.core.config import Section, load
from astraflow.core.errors import ConfigError
from astraflow.gateway.config import GatewayConfig
from astraflow.models.config import ModelConfig
from astraflow.policies.config import DataConfig
from astraflow.producers.config import ProducerConfig
from astraflow.weights.config import WeightsConfig


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
    metrics: MetricsConfig = MetricsConfig()  # metric sinks (docs/metrics.md)

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
        refuse(unknown(models, info.data.get("policies")))
        return models

    @pydantic.field_validator("launch")
    @classmethod
    def _known_warmup_policies(cls, launch: LaunchConfig,
                               info: pydantic.ValidationInfo) -> LaunchConfig:
        refuse(unknown(launch.warmup.policies, info.data.get("policies"),
                         ("warmup", "policies")))
        return launch

    @pydantic.field_validator("data")
    @classmethod
    def _known_data_policies(cls, data: DataConfig,
                             info: pydantic.ValidationInfo) -> DataConfig:
        policies = info.data.get("policies")
        primary = [data.primary_policy] if data.primary_policy is not None else []
        refuse(unknown(data.batch_sizes, policies, ("batch_sizes",))
                + unknown(data.max_staleness_per_policy, policies,
                           ("max_staleness_per_policy",))
                + unknown(primary, policies, ("primary_policy",), keyed=False))
        return data

    @pydantic.field_validator("scale")
    @classmethod
    def _known_pool_policies(cls, scale: ScaleConfig,
                             info: pydantic.ValidationInfo) -> ScaleConfig:
        policies = info.data.get("policies")
        refuse([e for name, pool in scale.pools.items()
                 for e in unknown(pool.policies, policies, ("pools", name, "policies"),
                                   keyed=False)])
        return scale

    @pydantic.field_validator("gateway")
    @classmethod
    def _known_gateway_policies(cls, gateway: GatewayConfig,
                                info: pydantic.ValidationInfo) -> GatewayConfig:
        policies = info.data.get("policies")
        refuse(unknown(gateway.policies or [], policies, ("policies",), keyed=False)
                + [e for alias, p in gateway.aliases.items()
                   for e in unknown([p], policies, ("aliases", alias), keyed=False)])
        return gateway

    @pydantic.field_validator("trainers")
    @classmethod
    def _whole_trainer_sections(cls, trainers: dict[str, dict[str, Any]],
                                info: pydantic.ValidationInfo) -> dict[str, dict[str, Any]]:
        """Each policy's merged section is validated now, so a bad override fails at load
        time with its path (``trainers.<policy>.<key>``), every problem at once; so is a key
        that names no policy."""
        errors = unknown(trainers, info.data.get("policies"))
        base = info.data.get("trainer")
        for policy, override in trainers.items():
            if base is None:  # `trainer` is invalid and reported; a merge would only echo it
                break
            try:
                with_overrides(base, override)
            except pydantic.ValidationError as e:
                errors += [InitErrorDetails(type=trainer_error(err),
                                            loc=(policy, *err["loc"]), input=err["input"])
                           for err in e.errors()]
        refuse(errors)
        return trainers


    @pydantic.model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any,
                       handler: pydantic.ModelWrapValidatorHandler[ExperimentConfig],
                       ) -> ExperimentConfig:
        """The cross-section checks (:mod:`astraflow.config.checks`), every one, with the
        field errors: when sections fail, the checks that read none of them still run, on
        the config with those sections left at their defaults, so one load reports it all."""
        try:
            config = handler(data)
        except pydantic.ValidationError as e:
            found = e.errors()
            failed = {err["loc"][0] for err in found if err["loc"]}
            if not isinstance(data, dict):
                raise
            try:  # the sections that validated, the failed ones at their defaults
                partial = handler({k: v for k, v in data.items() if k not in failed})
            except pydantic.ValidationError:
                raise e from None  # a failed section (policies) decides what else is valid
            cross = problems(partial, failed)
            if not cross:
                raise
            raise pydantic.ValidationError.from_exception_data(
                cls.__name__, [again(err) for err in found] + cross) from None
        refuse(problems(config))
        # the samples per task are one number, ``producer.n_samples``: the assembler's
        # fallback for trajectories that do not carry it follows it unless set
        if config.data.assembler.group_size is None:
            config.data.assembler.group_size = config.producer.n_samples
        return config


def load_experiment(path: str | Path | None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    return load(ExperimentConfig, path, overrides)
