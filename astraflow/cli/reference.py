"""The CLI reference page (docs/reference/cli.md), generated from the Typer app itself.

Written from the click command tree that Typer builds, not from ``--help`` output, so that the
page does not depend on the terminal's width or on rich's styling, and a test
(tests/test_docs.py) can compare it with the app: a command, option or default changed in code
and not in the docs fails the suite. Regenerate with
``python -m astraflow.cli.reference > docs/reference/cli.md``.
"""

from __future__ import annotations

import enum
import inspect
from pathlib import PurePath
from typing import Any

HEADER = """# CLI reference

Generated from the command-line app (`astraflow/cli/app.py`) by
`python -m astraflow.cli.reference > docs/reference/cli.md`; do not edit (a test compares this
page with the app). Every command also answers `--help`.

Environment variables:

- `ASTRAFLOW_BUS=URL` sets the bus for every command: `topics` and `inspect` take it as their
  `--bus`, and the commands that read an experiment config take it as `bus.url` (an explicit
  `--set bus.url=...` or `run --bus` still wins).
- `ASTRAFLOW_LOG_LEVEL=INFO` (or `astraflow --log-level INFO ...`) sets the log level of a
  command and, through the environment, of every role `astraflow run` starts (their logs are in
  the run directory's `logs/`).
"""


def _is_option(param: Any) -> bool:
    """click's Option (typer >= 0.20 vendors click, so duck typing rather than isinstance)."""
    return getattr(param, "param_type_name", "") == "option"


def _is_group(cmd: Any) -> bool:
    return hasattr(cmd, "list_commands")


def _default(param: Any) -> str:
    """A parameter's default as the page shows it; '' when there is none to show."""
    if param.required:
        return "required"
    value = param.default
    if callable(value):
        return "(computed)"
    if _is_option(param) and param.is_flag and not param.secondary_opts:
        return "" if not value else "on"
    if _is_option(param) and param.secondary_opts:
        return param.opts[0] if value else param.secondary_opts[0]
    if value is None or value == () or value == []:
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, PurePath):
        value = str(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(f"`{v}`" for v in value)
    return f"`{value}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _param_row(param: Any) -> str:
    if not _is_option(param):
        name = f"`{(param.metavar or param.name).upper()}`"
        kind = "argument"
    else:
        names = list(param.opts)
        if param.secondary_opts:
            names = [f"{param.opts[0]} / {param.secondary_opts[0]}"]
        name = ", ".join(f"`{n}`" for n in names)
        kind = "flag" if param.is_flag else "option"
        if param.multiple:
            kind += ", repeatable"
    envvar = getattr(param, "envvar", None)
    help_text = _cell(getattr(param, "help", None))
    if envvar:
        help_text += f" (env: `{envvar}`)" if help_text else f"env: `{envvar}`"
    return f"| {name} | {kind} | {_cell(_default(param))} | {help_text} |"


def _usage(cmd: Any, path: str) -> str:
    pieces = [path]
    if any(_is_option(p) for p in cmd.params):
        pieces.append("[OPTIONS]")
    for p in cmd.params:
        if not _is_option(p):
            arg = (p.metavar or p.name).upper()
            arg = arg if p.required else f"[{arg}]"
            pieces.append(f"{arg}..." if p.nargs == -1 else arg)
    if _is_group(cmd):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _walk(cmd: Any, path: str, level: int, out: list[str]) -> None:
    out += [f"{'#' * level} `{path}`", ""]
    doc = inspect.cleandoc(cmd.help or "")
    if doc:
        out += [" ".join(doc.split("\b")).strip(), ""]
    out += ["```", _usage(cmd, path), "```", ""]
    params = [p for p in cmd.params if not getattr(p, "hidden", False)
              and p.name not in ("help", "install_completion", "show_completion")]
    if params:
        out += ["| parameter | kind | default | description |", "|---|---|---|---|"]
        out += [_param_row(p) for p in params]
        out.append("")
    if _is_group(cmd):
        ctx = cmd.context_class(cmd)
        names = [n for n in cmd.list_commands(ctx) if not cmd.get_command(ctx, n).hidden]
        if names:
            out += ["| command | what it does |", "|---|---|"]
            for n in names:
                sub = cmd.get_command(ctx, n)
                out.append(f"| [`{n}`](#{github_slug(f'{path} {n}')}) | "
                           f"{_cell(sub.get_short_help_str(limit=200))} |")
            out.append("")
        for n in names:
            _walk(cmd.get_command(ctx, n), f"{path} {n}", min(level + 1, 4), out)


def github_slug(title: str) -> str:
    """GitHub's heading ids: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    import re

    text = title.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def cli_reference_markdown() -> str:
    """The whole page."""
    import typer

    from astraflow.cli.app import app

    root = typer.main.get_command(app)
    out = [HEADER]
    _walk(root, "astraflow", 2, out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(cli_reference_markdown(), end="")
