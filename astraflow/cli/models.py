"""`astraflow models`: bring a model here as a plain safetensors folder (import a gguf file, a
hub id or a shortcut), list the imports in the cache, describe what a model path names.

Module-level imports stay light (typer and the stdlib): torch and transformers load inside
``import`` only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from astraflow.cli.common import fail

app = typer.Typer(help="Models: import a gguf file, a hub id or a shortcut into a safetensors "
                       "folder; list the cache; describe a model path (docs/models.md).",
                  no_args_is_help=True)


@app.command("import")
def import_(
    source: Annotated[str, typer.Argument(help="A .gguf file, a Hugging Face hub id (org/name) "
                                               "or a shortcut (smollm2-135m-instruct).")],
    dest: Annotated[Path | None, typer.Argument(
        help="The folder to write (new, or empty). Default: where models.<policy>.path: "
             "SOURCE resolves (the cache; a hub id: the Hugging Face cache).")] = None,
) -> None:
    """Import SOURCE (gguf file, hub id, shortcut) as a safetensors model folder DEST.

    DEST gets safetensors weights (a gguf file dequantized to fp32), the tokenizer with its
    chat template, and astraflow-source.json (source, sha256, versions, date, parameter
    count). Set models.<policy>.path to DEST. Without DEST, SOURCE goes where a config naming
    it (models.<policy>.path: SOURCE) finds it, imported once: set the path to SOURCE itself."""
    from rich.console import Console
    from rich.markup import escape

    from astraflow.core.errors import AstraflowError

    console = Console(stderr=True, log_path=False)
    try:
        with console.status(f"importing {escape(source)}") as status:
            def progress(msg: str) -> None:
                status.update(escape(msg))
                console.log(escape(msg), highlight=False)

            folder = _import(source, dest, progress)
    except AstraflowError as e:
        raise fail(str(e)) from None
    if dest is not None:
        typer.echo(f"wrote {folder}{_size(folder)}; set models.<policy>.path to it")
    else:
        typer.echo(f"{source} is in {folder}{_size(folder)}; set models.<policy>.path to "
                   f"{source} (it resolves to that folder) or to the folder itself")


def _import(source: str, dest: Path | None, progress: Callable[[str], None]) -> Path:
    """SOURCE imported into ``dest``, or (None) where ``models.<policy>.path: SOURCE``
    resolves: a gguf file's or a shortcut's import in the cache, a hub id's snapshot in the
    Hugging Face cache (each made once; an existing one is kept)."""
    from astraflow.core.errors import ConfigError
    from astraflow.models.importer import import_source
    from astraflow.models.source import SHORTCUTS, classify, resolve

    if dest is not None:
        return import_source(source, dest, progress=progress)
    if classify(source) not in ("gguf", "shortcut", "hub"):
        raise ConfigError(f"SOURCE {source!r} is no .gguf file, hub id (org/name) or "
                          f"shortcut ({', '.join(SHORTCUTS)}), so it has no default DEST: give "
                          "one, or use a model folder as it is (models.<policy>.path: FOLDER)")
    return resolve(source, key="SOURCE", progress=progress)


def _size(folder: Path) -> str:
    """``, 134.5M parameters`` of the model in ``folder`` (empty when unknown)."""
    from astraflow.models.source import SOURCE_FILE, count_parameters

    try:
        params = json.loads((folder / SOURCE_FILE).read_text()).get("parameters")
    except (OSError, ValueError):  # a hub snapshot has no import record
        params = count_parameters(folder)
    return f", {params / 1e6:.1f}M parameters" if params else ""


@app.command("list")
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """List the imports in the cache, and the shortcuts.

    The cache: $ASTRAFLOW_CACHE/models, or ~/.cache/astraflow/models."""
    from astraflow.models.source import SHORTCUTS, SOURCE_FILE, cache_root, has_model

    root = cache_root()
    rows = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.name.startswith(".") or not has_model(folder):
            continue
        try:
            info = json.loads((folder / SOURCE_FILE).read_text())
        except (OSError, ValueError):
            info = {}
        rows.append({"folder": str(folder), "source": info.get("source"),
                     "parameters": info.get("parameters"), "date": info.get("date")})
    if as_json:
        typer.echo(json.dumps({"cache": str(root), "imports": rows,
                               "shortcuts": sorted(SHORTCUTS)}, indent=2))
        return
    typer.echo(f"cache: {root}")
    for r in rows:
        params = f"{r['parameters'] / 1e6:.1f}M" if r["parameters"] else "?"
        typer.echo(f"  {r['folder']}  {params}  from {r['source']}  ({r['date']})")
    if not rows:
        typer.echo("  (no imports yet)")
    typer.echo("shortcuts: " + ", ".join(f"{s.name} ({s.requirement}: {s.file})"
                                         for s in SHORTCUTS.values()))


@app.command("describe")
def describe(
    path: Annotated[str, typer.Argument(help="A model path as models.<policy>.path takes it.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Say what a model path names, without loading or downloading anything.

    The kind (folder, gguf, hub, shortcut), where its folder is, its size and what resolving
    it would do. Exit code 1 when it would not resolve."""
    from astraflow.models.source import describe_model

    info = describe_model(path)
    if as_json:
        typer.echo(json.dumps({"source": info.source, "kind": info.kind,
                               "folder": str(info.folder) if info.folder else None,
                               "target": str(info.target) if info.target else None,
                               "parameters": info.parameters, "problems": list(info.problems),
                               "notes": list(info.notes)}, indent=2))
    else:
        typer.echo(info.describe())
    if info.problems:
        raise typer.Exit(1)
