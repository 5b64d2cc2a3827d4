"""Actuators: how the scaler changes a pool's size (docs/elastic.md#actuators), chosen by the
pool's ``actuator.type``: ``local`` (:class:`~.local.LocalActuator`, processes on this host) or
``command`` (:class:`~.command.CommandActuator`, a templated shell command for Slurm,
``kubectl scale`` or anything else).

An installed package adds a type under the ``astraflow.actuators`` entry-point group: a builder
called like the two below, returning an :class:`~.actuation.Actuator` (docs/plugins.md).
"""

from __future__ import annotations

from typing import Protocol

from astraflow.consumers.scaler.actuation import Actuation, Actuator
from astraflow.consumers.scaler.command import CommandActuator
from astraflow.consumers.scaler.config import ACTUATOR_GROUP, ActuatorConfig
from astraflow.consumers.scaler.local import LocalActuator, rollout_argv
from astraflow.core.errors import ConfigError
from astraflow.core.registry import Registry, RegistryError

__all__ = ["ACTUATORS", "Actuation", "Actuator", "CommandActuator", "LocalActuator",
           "build_actuator", "rollout_argv"]


class _Builder(Protocol):
    def __call__(self, config: ActuatorConfig, *, run: str, pool: str,
                 config_path: str | None, out: str) -> Actuator: ...


def _local(config: ActuatorConfig, *, run: str, pool: str, config_path: str | None,
           out: str) -> Actuator:
    if config_path is None:
        raise ConfigError(f"scale.pools.{pool}.actuator: type local starts `astraflow rollout "
                          "CONFIG` processes and needs the experiment config's path; give "
                          "it, or use type command")
    return LocalActuator(config_path=config_path, out=out, pool=pool,
                         rollout_args=config.rollout_args)


def _command(config: ActuatorConfig, *, run: str, pool: str, config_path: str | None,
             out: str) -> Actuator:
    if config.command is None:
        raise ConfigError(f"scale.pools.{pool}.actuator: type command needs `command`, e.g. "
                          "'kubectl scale deployment/astraflow-rollout --replicas={target}'")
    try:
        return CommandActuator(config.command, run=run, pool=pool,
                               count_command=config.count_command, timeout_s=config.timeout_s,
                               retries=config.retries, backoff_s=config.backoff_s)
    except ConfigError as e:
        raise ConfigError([f"scale.pools.{pool}.{p}" for p in e.problems]) from None


#: actuator ``type`` -> builder: the built-ins, then the installed packages' (entry points)
ACTUATORS: Registry[_Builder] = Registry("actuator type", group=ACTUATOR_GROUP)
ACTUATORS.add("local", _local)
ACTUATORS.add("command", _command)


def build_actuator(config: ActuatorConfig, *, run: str, pool: str,
                   config_path: str | None = None, out: str = ".") -> Actuator:
    """The actuator of pool ``pool`` of run ``run`` from its config (``config_path`` and
    ``out``: the experiment file and run directory a ``local`` actuator's processes get)."""
    if config.type not in ACTUATORS:
        raise ConfigError(f"unknown actuator type {config.type!r} in scale.pools.{pool}; "
                          f"valid: {', '.join(ACTUATORS.names())}")
    try:
        builder = ACTUATORS.resolve(config.type)
    except RegistryError as e:
        raise ConfigError(f"scale.pools.{pool}.actuator: {e}") from None
    return builder(config, run=run, pool=pool, config_path=config_path, out=out)


