"""Config section ``scale``: the reporter's window, the scaler's rule (zones, bounds, cooldown,
hysteresis) and its actuator (docs/elastic.md has the long form).

Only pydantic here: imported by ``astraflow.config``, which ``astraflow --help`` loads.
"""

from __future__ import annotations

import pydantic

from astraflow.core.config import Section

#: the entry-point group an installed package registers actuator types in (docs/plugins.md)
ACTUATOR_GROUP = "astraflow.actuators"
BUILTIN_ACTUATORS = ("local", "command")


class ActuatorConfig(Section):
    """How the scaler changes the number of rollout processes."""

    type: str = pydantic.Field(
        "local", description="local: start and stop `astraflow rollout` processes on this host "
        "(under `astraflow run`: through its supervisor); command: run `command` with the "
        "target count (Slurm, `kubectl scale`, anything); or the name of an actuator an "
        "installed package registers (entry-point group astraflow.actuators)")
    command: str | None = pydantic.Field(
        None, description="command: a shell command template; {target}, {current}, {pool}, "
        "{run} are filled in, e.g. `kubectl scale deployment/rollout --replicas={target}`")
    count_command: str | None = pydantic.Field(
        None, description="command: optional template printing the current count (an "
        "integer on stdout); absent: the reporter's count of live workers")
    timeout_s: float = pydantic.Field(60.0, gt=0, description="command: seconds per call")
    retries: int = pydantic.Field(
        3, ge=0, description="a failing call is retried this many times, with backoff")
    backoff_s: float = pydantic.Field(
        1.0, ge=0, description="first retry's delay; doubled each retry (capped at 60 s)")
    rollout_args: list[str] = pydantic.Field(
        default_factory=list, description="local: extra arguments of each `astraflow rollout`")

    @pydantic.field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value in BUILTIN_ACTUATORS:
            return value
        from astraflow.core.registry import entry_points

        installed = sorted(set(entry_points(ACTUATOR_GROUP)) - set(BUILTIN_ACTUATORS))
        if value not in installed:
            raise ValueError(f"unknown actuator type {value!r}; valid: "
                             f"{', '.join([*BUILTIN_ACTUATORS, *installed])} (an installed "
                             f"package adds one under the entry-point group {ACTUATOR_GROUP})")
        return value

    @pydantic.model_validator(mode="after")
    def _command_needs_template(self) -> ActuatorConfig:
        if self.type == "command" and not (self.command or "").strip():
            raise ValueError("actuator type command needs `command`, e.g. "
                             "'kubectl scale deployment/rollout --replicas={target}'")
        return self


class PoolConfig(Section):
    """A rollout pool: processes that serve ``policies`` (every policy when empty)."""

    policies: list[str] = pydantic.Field(
        default_factory=list, description="the policies whose trainers this pool feeds (their "
        "largest wait ratio drives it); empty: every policy of the run")
    min_workers: int = pydantic.Field(1, ge=0, description="never fewer processes")
    max_workers: int = pydantic.Field(4, ge=1, description="never more processes")
    actuator: ActuatorConfig = ActuatorConfig()

    @pydantic.model_validator(mode="after")
    def _bounds(self) -> PoolConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers {self.min_workers} > max_workers {self.max_workers}")
        return self


class ScaleConfig(Section):
    """The reporter and the scaler (docs/elastic.md)."""

    enabled: bool = pydantic.Field(
        False, description="`astraflow run` starts the reporter and runs the scaler on its "
        "rollout processes (from launch.rollout_workers, within the pool's bounds)")
    report_every_steps: int = pydantic.Field(
        10, ge=1, description="a LoadReport every N trainer steps (of any policy's trainer)")
    report_every_s: float | None = pydantic.Field(
        30.0, gt=0, description="also a report after this many seconds without one (a trainer "
        "starved of input makes no steps); null: by steps only")
    min_window_s: float = pydantic.Field(
        5.0, ge=0, description="no report on a window shorter than this (counters arrive with "
        "heartbeats, every rollout.metrics_interval seconds: a shorter window is noise)")
    heartbeat_timeout_s: float = pydantic.Field(
        15.0, gt=0, description="a worker silent this long is reported unhealthy")
    high_wait: float = pydantic.Field(
        0.10, gt=0, lt=1, description="w above this: scale up to ceil(G / (1 - w))")
    low_wait: float = pydantic.Field(
        0.05, ge=0, lt=1, description="w below this: scale down to "
                                      "min(G, ceil(G * consumed/produced * headroom))")
    headroom: float = pydantic.Field(1.1, ge=1.0, description="the scale-down safety margin")
    use_useful_lag: bool = pydantic.Field(
        True, description="in the hold zone and below it, do not scale down while the useful "
        "lag is more than the pool clears in one report window (work the trainer will use)")
    cooldown_s: float = pydantic.Field(
        60.0, ge=0, description="seconds after an action before the next one")
    up_cooldown_s: float | None = pydantic.Field(
        None, ge=0, description="the cooldown before scaling up (a starved trainer should not "
        "wait out a scale-down's cooldown); null: cooldown_s")
    confirm: int = pydantic.Field(
        2, ge=1, description="hysteresis: act only when this many reports in a row agree on "
                             "the direction (up or down)")
    max_step_up: int | None = pydantic.Field(
        None, ge=1, description="add at most this many processes per action; null: no limit")
    max_step_down: int | None = pydantic.Field(
        1, ge=1, description="remove at most this many processes per action; null: no limit")
    pools: dict[str, PoolConfig] = pydantic.Field(
        default_factory=lambda: {"rollout": PoolConfig()},
        description="rollout pools by name; the default: one pool serving every policy")

    @pydantic.model_validator(mode="after")
    def _zones(self) -> ScaleConfig:
        if self.low_wait >= self.high_wait:
            raise ValueError(f"low_wait {self.low_wait} must be below high_wait "
                             f"{self.high_wait} (between them the scaler holds)")
        if not self.pools:
            raise ValueError("pools: name at least one rollout pool")
        local = [n for n, p in self.pools.items() if p.actuator.type == "local"]
        if len(local) > 1:
            raise ValueError(f"pools {', '.join(local)} both use the local actuator; one "
                             "host runs one local pool (give the others a command actuator)")
        return self
