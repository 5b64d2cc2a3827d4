"""`astraflow plugins`: every name the registries resolve, per entry-point group, with where it
comes from (built-in, or the installed distribution whose entry point declares it), so a user
can see that the package they installed registered what its config names (docs/plugins.md).

The registries load when the command runs (rollout's rewards and workflows import their
modules); `astraflow --help` imports none of them.
"""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Annotated

import typer

from astraflow.cli.common import fail

if TYPE_CHECKING:
    from astraflow.core.registry import Registry

#: entry-point group -> the registry it feeds, as "module:attr"
GROUPS = {
    "astraflow.workflows": "astraflow.consumers.rollout.workflows:WORKFLOWS",
    "astraflow.rewards": "astraflow.consumers.rollout.rewards:REWARDS",
    "astraflow.tools": "astraflow.consumers.rollout.tools:TOOLS",
    "astraflow.policies": "astraflow.policies.registry:REGISTRY",
    "astraflow.actuators": "astraflow.consumers.scaler.actuators:ACTUATORS",
}


def registry(group: str) -> Registry[object]:  # type: ignore[type-var]
    """The registry that entry-point group ``group`` feeds."""
    module, _, attr = GROUPS[group].partition(":")
    reg: Registry[object] = getattr(importlib.import_module(module), attr)  # type: ignore[type-var]
    return reg


def plugins(
    group: Annotated[str | None, typer.Argument(
        help="One group (astraflow.workflows, or just workflows); default: every group.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """List every registered workflow, reward, tool, policy and actuator, and where each comes
    from: built-in, or an entry point of an installed package (docs/plugins.md)."""
    groups = list(GROUPS)
    if group is not None:
        name = group if group.startswith("astraflow.") else f"astraflow.{group}"
        if name not in GROUPS:
            raise fail(f"unknown plug-in group {group!r}; valid: "
                       f"{', '.join(g.removeprefix('astraflow.') for g in GROUPS)}")
        groups = [name]
    listing = {g: registry(g).origins() for g in groups}
    if as_json:
        typer.echo(json.dumps({g: [{"name": o.name, "source": o.source, "target": o.target,
                                    "distribution": o.distribution, "shadowed": o.shadowed}
                                   for o in origins]
                               for g, origins in listing.items()}, indent=1))
        return
    for g, origins in listing.items():
        typer.echo(f"{g} ({registry(g).kind})")
        wheres = ["built-in" if o.source == "built-in" else f"entry point of {o.distribution}"
                  for o in origins]
        width = max((len(o.name) for o in origins), default=0)
        wide = max((len(w) for w in wheres), default=0)
        for o, where in zip(origins, wheres, strict=True):
            note = " (shadowed by the built-in of that name: unused)" if o.shadowed else ""
            typer.echo(f"  {o.name:<{width}}  {where:<{wide}}  {o.target}{note}")
        if not origins:
            typer.echo("  (none)")
