"""Loading configuration: YAML + ``--set a.b=c`` overrides → a pydantic model, with every
problem reported at once, each with the path of the bad key and a hint.

The experiment model itself is :class:`astraflow.config.ExperimentConfig`; each subpackage
owns the model of its own section. Models derive from :class:`Section` (unknown keys
rejected).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pydantic

from astraflow.core.errors import ConfigError

M = TypeVar("M", bound=pydantic.BaseModel)


class Section(pydantic.BaseModel):
    """Base of every config model: unknown keys are errors, values are validated on assignment."""

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"trainer.lr=3e-4"`` → (["trainer", "lr"], 0.0003). The value is parsed as YAML, so
    numbers, booleans, lists (``[a, b]``) and null work; anything else is a string."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"bad override {text!r}: expected key.path=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return [p for p in key.strip().split(".")], value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a nested dict (creating intermediate dicts)."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(path[:i + 1])} is not a "
                                  "section")
            node = nxt
        node[path[-1]] = value
    return data


def _hint(err: Mapping[str, Any], model: type[pydantic.BaseModel]) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "<root>"
    if err["type"] == "extra_forbidden":
        parent: Any = model
        for part in err["loc"][:-1]:
            fields = getattr(parent, "model_fields", None)
            if fields and part in fields:
                ann = fields[part].annotation
                parent = ann if isinstance(ann, type) else None
            else:
                parent = None
        valid = sorted(parent.model_fields) if parent is not None and hasattr(
            parent, "model_fields") else []
        suffix = f"; valid keys here: {', '.join(valid)}" if valid else ""
        return f"{loc}: unknown key{suffix}"
    got = f" (got {err['input']!r})" if "input" in err and not isinstance(
        err["input"], dict) else ""
    return f"{loc}: {err['msg']}{got}"


def validate(model: type[M], data: Mapping[str, Any], *, source: str = "config") -> M:
    """Validate ``data`` against ``model``; raise one ConfigError listing every problem."""
    try:
        return model.model_validate(dict(data))
    except pydantic.ValidationError as e:
        raise ConfigError([f"{source}: {_hint(err, model)}" for err in e.errors()]) from None


def load(model: type[M], path: str | Path | None = None, overrides: Iterable[str] = ()) -> M:
    """Read a YAML file (or nothing), apply overrides, validate."""
    import yaml

    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            loaded = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        data = loaded or {}
    return validate(model, apply_overrides(data, overrides), source=source)


def dump(config: pydantic.BaseModel) -> str:
    """The resolved config as YAML (what ``astraflow config show`` prints)."""
    import yaml

    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
