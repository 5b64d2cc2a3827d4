"""`astraflow config show|reference`: the resolved config, and the generated reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(help="Show a resolved experiment config; print the configuration reference.",
                  no_args_is_help=True)


@app.command()
def show(
    config: Annotated[Path | None, typer.Argument(help="Experiment YAML (none: defaults).")]
    = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="Override a.b=c.")]
    = None,
) -> None:
    """Print the config with every default filled in and overrides applied (as YAML)."""
    from astraflow.cli.common import fail, with_env_bus
    from astraflow.config import load_experiment
    from astraflow.core.config import dump
    from astraflow.core.errors import ConfigError

    try:
        cfg = load_experiment(config, with_env_bus(overrides))
    except ConfigError as e:
        raise fail(str(e)) from None
    typer.echo(dump(cfg), nl=False)


def _type_name(ann: Any) -> str:
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    return text or str(ann).replace("typing.", "")


def reference_markdown() -> str:
    """Every key of the experiment config with its type, default and description."""
    import pydantic

    from astraflow.config import ExperimentConfig

    lines = ["# Configuration reference", "",
             "Generated from the config models by `astraflow config reference`; do not edit.",
             "Every key below may appear in the experiment YAML or in `--set key.path=value`.",
             "Unknown keys are errors.", ""]

    def walk(model: type[pydantic.BaseModel], prefix: str) -> None:
        rows = []
        nested = []
        for name, f in model.model_fields.items():
            ann = f.annotation
            key = f"{prefix}{name}"
            if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
                nested.append((ann, key))
                continue
            default = "(required)" if f.is_required() else repr(
                f.default_factory() if f.default_factory is not None else f.default)
            desc = (f.description or "").replace("|", "\\|").replace("\n", " ")
            rows.append(f"| `{key}` | `{_type_name(ann)}` | `{default}` | {desc} |")
        if rows:
            lines.extend([f"## `{prefix.rstrip('.') or '(top level)'}`", "",
                          (model.__doc__ or "").strip().split("\n")[0], "",
                          "| key | type | default | meaning |", "|---|---|---|---|", *rows, ""])
        for sub, key in nested:
            walk(sub, key + ".")

    walk(ExperimentConfig, "")
    return "\n".join(lines)


@app.command()
def reference() -> None:
    """Print the configuration reference (Markdown) generated from the config models."""
    typer.echo(reference_markdown())
