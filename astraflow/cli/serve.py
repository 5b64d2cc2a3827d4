"""``astraflow serve CONFIG``: the agent gateway, an OpenAI-compatible endpoint over the run's
current policy (docs/gateway.md).

Mounted in the main app as ``app.command("serve")(serve.serve)``. Imports stay light (typer,
stdlib); FastAPI, uvicorn and the engines load when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
    http://HOST:PORT/sessions/<episode>/v1 (with X-Group-Id and X-Group-Size), then POST
    /sessions/<episode>/reward and /end; the episode becomes Trajectory records on the run's
    `trajectories` topic. Joins the run in --out, or starts its bus there when it has none.
    SIGTERM/SIGINT: finish the requests in flight, exit."""
    from astraflow.cli.common import fail, load_config, run_dir
    from astraflow.core.errors import AstraflowError
    from astraflow.gateway.auth import is_loopback
    from astraflow.run.roles import gateway_exposure, serve_gateway

    early = load_config(config, overrides)
    if not is_loopback(host or early.gateway.host):
        try:  # an exposed gateway is refused before the run directory is looked at
            gateway_exposure(early, host)
        except AstraflowError as e:
            raise fail(str(e)) from None
    out = new_bus(early, run_dir(early, out))
    try:
        serve_gateway(early, out, policy=policy, host=host, port=port)
    except AstraflowError as e:
        raise fail(str(e)) from None


def new_bus(cfg: Any, out: Path) -> Path:
    """``out``, where the gateway joins the run's embedded bus or, when there is none yet,
    starts it (the gateway is where an agent's data enters a run: the trainer's roles join it
    afterwards). Said on stderr, with the commands that train on what the gateway records."""
    from astraflow.cli.common import embedded_bus_file

    bus = embedded_bus_file(cfg, out)
    if bus is None or bus.exists():
        return out
    bus.parent.mkdir(parents=True, exist_ok=True)
    typer.echo(f"no bus in {out}: starting the run's bus there ({bus}); the roles that train "
               f"on the sessions join it with --out {out} (`astraflow policy CONFIG "
               "post_rollout`, `astraflow policy CONFIG batch`, `astraflow train CONFIG`)",
               err=True)
    return out
