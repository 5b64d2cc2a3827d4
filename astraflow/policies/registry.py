"""The registry of policies (name → factory) and ``build_chain``, which turns a stage's config
into a :class:`~astraflow.policies.chain.Chain`.

A user policy is named ``"module.path:factory"`` in the config, or by the name an installed
package registers under the ``astraflow.policies`` entry-point group; ``factory(env)`` is
called with a :class:`~astraflow.policies.env.BuildEnv` (its ``options`` are
``data.options[entry]``) and returns an object meeting :class:`~astraflow.policies.base.Policy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from astraflow.core.errors import ConfigError
from astraflow.core.registry import Registry, RegistryError
from astraflow.policies import assembler, batcher, filters, gate, greso, replay
from astraflow.policies.base import Policy
from astraflow.policies.chain import Chain
from astraflow.policies.config import (
    BUILTINS,
    GROUP,
    STAGES,
    DataConfig,
    Spec,
    check_chain,
    is_custom,
)
from astraflow.policies.env import BuildEnv

Factory = Callable[[BuildEnv], Any]

#: policy name -> factory: the built-ins, then the installed packages' (entry points)
REGISTRY: Registry[Factory] = Registry("policy", group=GROUP)
for _name, _factory in {
    "gate": gate.build,
    "greso": greso.build,
    "assembler": assembler.build,
    "staleness": filters.build_staleness,
    "dynamic_sampling": filters.build_dynamic_sampling,
    "replay": replay.build,
    "batcher": batcher.build,
}.items():
    REGISTRY.add(_name, _factory)


def load_factory(entry: str, where: str) -> Factory:
    """The factory of policy ``entry`` (built-in, installed or a module path); a
    :class:`ConfigError` located at ``where`` when it cannot be had."""
    try:
        return REGISTRY.resolve(entry)
    except RegistryError as e:
        if e.reason == "import":
            raise ConfigError(f"{where}: cannot import {e.module!r} for policy {entry!r}: "
                              f"{e.cause}; is the module installed or on PYTHONPATH?") from None
        if e.reason in ("attribute", "not callable") and e.module:
            raise ConfigError(f"{where}: {e.module} has no callable {e.attr!r} (policy "
                              f"{entry!r})") from None
        raise ConfigError(f"{where}: {e}") from None


def _check_policy(obj: Any, entry: str, where: str) -> list[str]:
    missing = [a for a in ("name", "consumes", "produces", "init_state", "process")
               if not hasattr(obj, a)]
    if missing:
        return [f"{where}: {entry} returned {type(obj).__name__}, which lacks "
                f"{', '.join(missing)} (see astraflow.policies.base.Policy)"]
    return []


def build_policies(data: DataConfig, stage: str, *, policies: tuple[str, ...] = ("default",),
                   primary: str | None = None, policy: str | None = None, seed: int = 0
                   ) -> list[tuple[str, Policy]]:
    """The (entry, policy) pairs of ``stage``, in order; all problems raised at once."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")
    entries: list[str] = list(getattr(data, stage))
    primary = primary or data.primary_policy or policies[0]
    problems: list[str] = []
    if primary not in policies:
        problems.append(f"data.primary_policy: {primary!r} is not one of policies "
                        f"({', '.join(policies)})")
    if policy is not None and policy not in policies:
        problems.append(f"policy {policy!r} is not one of policies ({', '.join(policies)})")
    if problems:
        raise ConfigError(problems)
    built: list[tuple[str, Policy]] = []
    specs: dict[str, Spec] = {}
    for i, entry in enumerate(entries):
        where = f"data.{stage}[{i}]"
        env = BuildEnv(data=data, stage=stage, policies=policies, primary=primary,
                       policy=policy, seed=seed, options=dict(data.options.get(entry, {})))
        factory = load_factory(entry, where)
        try:
            obj = factory(env)
        except (TypeError, ValueError) as e:
            problems.append(f"{where}: building {entry} failed: {e}")
            continue
        bad = _check_policy(obj, entry, where)
        if bad:
            problems.extend(bad)
            continue
        if is_custom(entry):
            specs[entry] = Spec(obj.consumes.schema_name(), obj.produces.schema_name(),
                                tuple(getattr(obj, "stages", STAGES)))
        built.append((entry, obj))
    unknown_opts = sorted(set(data.options) - {e for e in entries if is_custom(e)}
                          - {e for s in STAGES for e in getattr(data, s)})
    if unknown_opts:
        problems.append(f"data.options: {', '.join(unknown_opts)} name no policy of any stage")
    if not problems:
        problems = check_chain(stage, entries, specs)
    if problems:
        raise ConfigError(problems)
    return built


def build_chain(data: DataConfig, stage: str, *, policies: tuple[str, ...] = ("default",),
                primary: str | None = None, policy: str | None = None, seed: int = 0) -> Chain:
    """The stage's chain of policies with fresh states (see :func:`build_policies`)."""
    built = build_policies(data, stage, policies=policies, primary=primary, policy=policy,
                           seed=seed)
    return Chain(stage, built, seed=seed)


__all__ = ["BUILTINS", "REGISTRY", "build_chain", "build_policies", "load_factory"]
