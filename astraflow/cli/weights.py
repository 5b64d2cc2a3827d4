"""`astraflow weights`: diff, apply and inspect weight files; benchmark the codec; serve and
mirror blobs.

Module-level imports stay light (typer and the stdlib): numpy and the codec load inside the
commands. Every file is written to a temporary name and renamed, so an error leaves no output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from astraflow.cli.common import OutOption, fail, secret_option

#: where `weights serve` and `weights mirror` read the workers' token when no file is given
#: (the http store's `token` defaults to it too: weights.store.token)
TOKEN_ENV = "ASTRAFLOW_WEIGHTS_TOKEN"
#: where `weights mirror` reads the upstream server's token when no file is given
UPSTREAM_TOKEN_ENV = "ASTRAFLOW_WEIGHTS_UPSTREAM_TOKEN"
TokenFileOption = Annotated[Path | None, typer.Option(
    help=f"File holding the bearer token workers must show (default: ${TOKEN_ENV}; none: no "
         "token).", dir_okay=False)]
TokenOption = Annotated[str | None, typer.Option(
    help="The bearer token on the command line, visible to every user in `ps`: prefer "
         "--token-file or $ASTRAFLOW_WEIGHTS_TOKEN.")]

app = typer.Typer(help="Sparse bf16 weight deltas: diff, apply, inspect, bench, serve, mirror.",
                  no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, sort_keys=True))


@app.command()
def diff(
    old: Annotated[Path, typer.Argument(help="Base .safetensors file.", exists=True,
                                        dir_okay=False)],
    new: Annotated[Path, typer.Argument(help="New .safetensors file.", exists=True,
                                        dir_okay=False)],
    out: Annotated[Path, typer.Option("--output", "-o", help="Delta blob to write.")],
    base_version: Annotated[int, typer.Option(help="Version number of OLD.")] = 0,
    version: Annotated[int | None, typer.Option(help="Version of NEW (default base+1).")] = None,
    level: Annotated[int, typer.Option(help="zstd level.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Write the delta that turns OLD into NEW (same tensor names, shapes and dtypes)."""
    from astraflow.core.errors import AstraflowError
    from astraflow.weights.blob import encode_version
    from astraflow.weights.files import write_atomic
    from astraflow.weights.safetensors_io import read_safetensors

    try:
        base, _ = read_safetensors(old)
        target, _ = read_safetensors(new)
        enc = encode_version(target, base=base, base_version=base_version,
                             version=base_version + 1 if version is None else version,
                             level=level)
        write_atomic(out, enc.blob)
    except AstraflowError as e:
        raise fail(str(e)) from None
    _report(_summary_blob(enc.header, len(enc.blob), out), as_json)


@app.command("apply")
def apply_(
    base: Annotated[Path, typer.Argument(help="Base .safetensors file.", exists=True,
                                         dir_okay=False)],
    delta: Annotated[Path, typer.Argument(help="Delta (or full) blob.", exists=True,
                                          dir_okay=False)],
    out: Annotated[Path, typer.Option("--output", "-o", help=".safetensors file to write.")],
    verify_base: Annotated[bool, typer.Option(help="Check BASE against the delta's base "
                                                   "digests first.")] = True,
) -> None:
    """Apply DELTA to BASE and write the result, bit-exact, verified by per-tensor digests."""
    from astraflow.core.errors import AstraflowError
    from astraflow.weights.blob import apply_version, parse_blob
    from astraflow.weights.safetensors_io import read_safetensors, write_safetensors

    try:
        tensors, meta = read_safetensors(base)
        blob = parse_blob(delta.read_bytes(), source=str(delta))
        result = apply_version(blob, tensors, verify_base=verify_base)
        size = write_safetensors(out, result, meta)
    except AstraflowError as e:
        raise fail(str(e)) from None
    typer.echo(f"wrote {out} ({len(result)} tensors, {size} bytes, version "
               f"{blob.header.version})")


def _summary_blob(header: Any, size: int, path: Path) -> dict[str, Any]:
    from math import prod

    from astraflow.weights.bits import dtype_info

    numel = sum(prod(t.shape) for t in header.tensors)
    dense = sum(prod(t.shape) * dtype_info(t.dtype).bits.itemsize for t in header.tensors)
    changed = sum(max(t.changed, 0) for t in header.tensors)
    return {
        "file": str(path), "kind": header.kind, "version": header.version,
        "base_version": header.base_version, "tensors": len(header.tensors), "elements": numel,
        "changed": changed if header.kind == "delta" else None,
        "changed_fraction": (changed / numel if numel else 0.0) if header.kind == "delta"
        else None,
        "bytes": size, "dense_bytes": dense, "ratio": dense / size if size else None,
        "encodings": sorted({t.enc for t in header.tensors}),
    }


def _report(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _echo_json(summary)
        return
    for key, value in summary.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.6g}"
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        typer.echo(f"{key:>16}: {value}")


@app.command()
def inspect(
    file: Annotated[Path, typer.Argument(help="A weight blob or .safetensors file.", exists=True,
                                         dir_okay=False)],
    tensors: Annotated[bool, typer.Option("--tensors", help="List every tensor.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Kind, versions, tensors, changed fraction, bytes and ratio to dense of a weight file."""
    from astraflow.core.errors import AstraflowError
    from astraflow.weights.blob import MAGIC, parse_blob
    from astraflow.weights.safetensors_io import read_safetensors

    try:
        with open(file, "rb") as f:
            magic = f.read(4)
        if magic == MAGIC:
            blob = parse_blob(file.read_bytes(), source=str(file))
            summary = _summary_blob(blob.header, file.stat().st_size, file)
            rows = [{"name": t.name, "dtype": t.dtype, "shape": t.shape, "encoding": t.enc,
                     "bytes": t.length, "changed": t.changed, "digest": t.digest}
                    for t in blob.header.tensors]
        else:
            st, meta = read_safetensors(file)
            dense = sum(b.nbytes for _d, b in st.values())
            summary = {"file": str(file), "kind": "safetensors", "tensors": len(st),
                       "elements": sum(b.size for _d, b in st.values()),
                       "bytes": file.stat().st_size, "dense_bytes": dense, "metadata": meta}
            rows = [{"name": n, "dtype": d, "shape": list(b.shape), "bytes": b.nbytes}
                    for n, (d, b) in st.items()]
    except AstraflowError as e:
        raise fail(str(e)) from None
    if tensors:
        summary["tensor_list"] = rows
    if as_json:
        _echo_json(summary)
        return
    _report({k: v for k, v in summary.items() if k != "tensor_list"}, False)
    for r in rows if tensors else []:
        typer.echo("  " + "  ".join(f"{k}={v}" for k, v in r.items()))


@app.command()
def bench(
    params: Annotated[int, typer.Option(help="Parameters of the synthetic bf16 model.")]
    = 100_000_000,
    unchanged: Annotated[list[float] | None, typer.Option(
        help="Fraction of values unchanged per step (repeat).")] = None,
    repeat: Annotated[int, typer.Option(help="Timing repeats (best is reported).")] = 3,
    as_json: JsonOption = False,
) -> None:
    """Size and one-core speed of the delta codec on a synthetic bf16 model, against dense,
    dense+zstd, uint32 index + value, and the entropy floor."""
    from astraflow.weights import bench as wbench

    results = wbench.run(params, tuple(unchanged or (0.989, 0.978)), repeat=repeat)
    if as_json:
        _echo_json([r.row() for r in results])
    else:
        typer.echo(wbench.table(results))


def _make_store_dir(directory: Path) -> bool:
    """Create the weight store directory ``directory`` if it is missing; whether it was."""
    if directory.is_dir():
        return False
    try:
        directory.mkdir(parents=True)
    except OSError as e:
        raise fail(f"weight store directory {directory} cannot be created "
                   f"({e.strerror or e}): give a directory you may write, or create it "
                   "first") from None
    return True


@app.command()
def serve(
    directory: Annotated[Path, typer.Argument(
        help="Weight store directory to serve (created if missing: it fills as the trainer "
             "publishes).", file_okay=False)],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: pick a free one).")] = 8470,
    token_file: TokenFileOption = None,
    token: TokenOption = None,
    max_connections: Annotated[int, typer.Option(
        help="Authenticated connections served at once (lowered to what ulimit -n allows); "
             "one more is answered 503.", min=1)] = 256,
    idle_timeout: Annotated[float, typer.Option(
        help="Seconds an authenticated connection has to send a whole request head, and may "
             "stay idle.", min=0.001)] = 30.0,
    max_unauthenticated: Annotated[int, typer.Option(
        help="Connections waiting to send their first request with the token; one more "
             "closes the oldest of them.", min=1)] = 64,
    auth_timeout: Annotated[float, typer.Option(
        help="Seconds a new connection has to send its first request head whole.",
        min=0.001)] = 5.0,
) -> None:
    """Serve a weight store over HTTP (ranged, resumable GETs; read-only). The bearer token
    workers must show comes from --token-file or $ASTRAFLOW_WEIGHTS_TOKEN (none: no token).
    A DIRECTORY that does not exist yet is created: a server may start before the trainer
    has published anything."""
    from astraflow.weights.server import make_server

    token = secret_option(token, token_file, flag="--token", env=TOKEN_ENV)
    created = _make_store_dir(directory)
    server = make_server(directory, host=host, port=port, token=token,
                         max_connections=max_connections, idle_timeout_s=idle_timeout,
                         max_unauthenticated=max_unauthenticated, auth_timeout_s=auth_timeout)
    typer.echo(f"serving {directory} at {server.url}" + (" (token required)" if token else "")
               + (" (created empty: it fills as the trainer publishes)" if created else ""))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@app.command()
def mirror(
    upstream: Annotated[str, typer.Argument(
        help="The trainer's weight store: http(s)://host:port (its `astraflow weights serve`) "
             "or a directory.")],
    serve_dir: Annotated[Path, typer.Option(
        "--serve", help="Directory of the mirrored blobs (created if missing), served over "
                        "HTTP to the region's workers.", file_okay=False)],
    config: Annotated[Path | None, typer.Option(
        "--config", help="Experiment YAML (its run, bus and policies).")] = None,
    bus: Annotated[str | None, typer.Option(help="Bus URL (overrides the config's).")] = None,
    run: Annotated[str | None, typer.Option(help="Run name (overrides the config's).")] = None,
    policies: Annotated[list[str] | None, typer.Option(
        "--policy", help="Policy to mirror (repeatable; default: the config's policies).")]
    = None,
    out: OutOption = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config override a.b=c.")]
    = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: pick a free one).")] = 8470,
    token_file: TokenFileOption = None,
    token: TokenOption = None,
    upstream_token_file: Annotated[Path | None, typer.Option(
        help="File holding the upstream server's bearer token (default: "
             f"${UPSTREAM_TOKEN_ENV}, else the workers' token).", dir_okay=False)] = None,
    upstream_token: Annotated[str | None, typer.Option(
        help="The upstream server's bearer token on the command line, visible in `ps`: "
             "prefer --upstream-token-file.")] = None,
    rate_limit: Annotated[float | None, typer.Option(
        help="Cap upstream downloads at this many bytes/s.", min=1)] = None,
    keep_versions: Annotated[int | None, typer.Option(
        help="Keep only the newest K versions and every version from the newest full on "
             "(default: keep all).", min=1)] = None,
    hold: Annotated[float, typer.Option(
        help="Seconds a request for a blob still being mirrored waits for it before the "
             "answer is 404 (workers then use their fallback).", min=0)] = 20.0,
) -> None:
    """Mirror a trainer's weight store for a region: follow weights.<policy>, fetch each blob
    once from UPSTREAM into the --serve directory (verified against its manifest before it is
    served), and serve that directory like `astraflow weights serve`. Workers of the region
    set weights.fetch to this server and weights.fallback to UPSTREAM. SIGTERM/SIGINT stops
    both."""
    import dataclasses
    import logging
    import threading

    from astraflow.cli.common import load_role, role_run
    from astraflow.run.resources import open_bus
    from astraflow.weights.http import HttpStore
    from astraflow.weights.mirror import Mirror, serve_mirror
    from astraflow.weights.store import FileStore, WeightStore

    token = secret_option(token, token_file, flag="--token", env=TOKEN_ENV)
    upstream_token = secret_option(upstream_token, upstream_token_file,
                                   flag="--upstream-token", env=UPSTREAM_TOKEN_ENV)
    overrides = list(set_ or [])
    if bus:
        overrides.append(f"bus.url={bus}")
    if run:
        overrides.append(f"run={run}")
    cfg, out = load_role(config, overrides, out)  # an embedded bus must be the run's, not new
    source: WeightStore
    if upstream.startswith(("http://", "https://")):
        source = HttpStore(upstream, token=upstream_token or token)
    elif Path(upstream).is_dir():
        source = FileStore(upstream)
    else:
        raise fail(f"upstream {upstream!r} is neither an http(s):// URL nor a directory; give "
                   "the trainer's weight server, e.g. http://trainer:8470")
    progress = logging.getLogger("astraflow.weights.mirror")
    if not progress.isEnabledFor(logging.INFO):  # one line per mirrored version by default
        progress.setLevel(logging.INFO)
    with role_run() as should_stop:
        b = open_bus(cfg, out)
        try:
            w = cfg.weights
            m = Mirror(b, run=cfg.run, policies=policies or cfg.policies, upstream=source,
                       root=serve_dir, rate_limit=rate_limit, keep_versions=keep_versions,
                       deadline_s=w.download_deadline_s, min_rate=w.download_min_rate)
            server = serve_mirror(m, host=host, port=port, token=token, hold_s=hold,
                                  **w.server.model_dump())
            server.timeout = 0.25  # handle_request() returns this often to check for a stop
            failed: list[BaseException] = []

            def follow() -> None:
                try:
                    m.run()
                except BaseException as e:  # noqa: BLE001 - reported by the main thread
                    failed.append(e)

            thread = threading.Thread(target=follow, name="weights-mirror", daemon=True)
            thread.start()
            typer.echo(f"mirroring {source!r} run={cfg.run} policies="
                       f"{','.join(policies or cfg.policies)}; serving {serve_dir} at "
                       f"{server.url}" + (" (token required)" if token else ""))
            try:
                while not should_stop() and thread.is_alive():
                    server.handle_request()
            finally:
                m.stop()
                thread.join(10)  # a blob in flight may take longer: its .part is resumed
                server.server_close()
                if not thread.is_alive():
                    m.close()
        finally:
            b.close()
        if failed:
            raise fail(f"the mirror stopped following the bus: {failed[0]}")
    typer.echo("mirror stopped: " + " ".join(
        f"{k}={v}" for k, v in dataclasses.asdict(m.stats).items()))
