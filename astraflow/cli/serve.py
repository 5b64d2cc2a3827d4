"""``astraflow serve CONFIG``: the agent gateway, an OpenAI-compatible endpoint over the run's
current policy (docs/gateway.md).

Mounted in the main app as ``app.command("serve")(serve.serve)``. Imports stay light (typer,
stdlib); FastAPI, uvicorn and the engines load when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import OutOption


def serve(
    config: Annotated[Path, typer.Argument(help="Experiment YAML file.")],
    out: OutOption = None,
    policy: Annotated[str | None, typer.Option(
        help="Serve this policy only (default: gateway.policies, else the rollout workers').")]
    = None,
    host: Annotated[str | None, typer.Option(help="Address (default: gateway.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: gateway.port).")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Config override a.b=c (repeatable).")] = None,
) -> None:
    """Serve the policies as an OpenAI-compatible API: point an agent's base URL at
    http://HOST:PORT/sessions/<episode>/v1, then POST /sessions/<episode>/reward and /end;
    the episode becomes Trajectory records on the run's `trajectories` topic. SIGTERM/SIGINT:
    finish the requests in flight, exit."""
    from astraflow.cli.common import fail, load_config, load_role
    from astraflow.core.errors import AstraflowError
    from astraflow.gateway.auth import is_loopback
    from astraflow.run.roles import gateway_exposure, serve_gateway

    early = load_config(config, overrides)
    if not is_loopback(host or early.gateway.host):
        try:  # an exposed gateway is refused before the run directory is looked at
            gateway_exposure(early, host)
        except AstraflowError as e:
            raise fail(str(e)) from None
    cfg, out = load_role(config, overrides, out)
    try:
        serve_gateway(cfg, out, policy=policy, host=host, port=port)
    except AstraflowError as e:
        raise fail(str(e)) from None
