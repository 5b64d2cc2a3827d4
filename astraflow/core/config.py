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
from astraflow.core.redact import redact_text, secret_key, secret_shape
from astraflow.core.secrets import (
    REDACTED,
    SECRETS_FILE,
    read_secrets,
    redacted_paths,
    restore,
    secret_at,
    split,
)

M = TypeVar("M", bound=pydantic.BaseModel)


class Section(pydantic.BaseModel):
    """Base of every config model: unknown keys are errors, values are validated on assignment."""

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


#: what PyYAML's safe loader raises besides YAMLError on text it cannot read: ValueError for
#: a date-like scalar that is no date (``2020-13-45``) or a bad explicit tag (``!!int x``),
#: KeyError/AttributeError/IndexError/TypeError for other bad tags, RecursionError for
#: collections nested past the interpreter's limit
_YAML_FAILURES = (ValueError, KeyError, AttributeError, IndexError, TypeError, RecursionError)


def _yaml(text: str) -> Any:
    """``yaml.safe_load(text)``; any failure to read it is a ``yaml.YAMLError``."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise
    except RecursionError:
        raise yaml.YAMLError("collections nested deeper than the parser allows") from None
    except _YAML_FAILURES as e:
        raise yaml.YAMLError(f"a value could not be read ({type(e).__name__}: {e}); quote it "
                             "to keep it a string") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"trainer.lr=3e-4"`` → (["trainer", "lr"], 0.0003). The value is parsed as YAML, so
    numbers, booleans, lists (``[a, b]``) and null work; anything else is a string."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"bad override {text!r}: expected key.path=value")
    try:
        value = _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return [p for p in key.strip().split(".")], value


def _secret(path: list[str], value: Any) -> bool:
    """Whether an override's key or value is a secret (an error never quotes its value)."""
    return (secret_at(tuple(path)) or any(secret_key(p) for p in path)
            or (isinstance(value, str) and secret_shape(value)))


def _shown(path: list[str], value: Any) -> str:
    """An override as an error quotes it: ``key=***`` when its key or value is a secret."""
    return f"{'.'.join(path)}={REDACTED if _secret(path, value) else value}"


def _given(text: str, path: list[str], value: Any) -> str:
    """The ``--set`` argument as the user typed it, quoted (``'key=***'`` for a secret)."""
    return repr(f"{'.'.join(path)}={REDACTED}" if _secret(path, value) else text.strip())


#: an override that was applied: its key path and how an error quotes it (``_given``)
Applied = tuple[list[str], str]


def _apply(data: dict[str, Any], overrides: Iterable[str],
           applied: list[Applied] | None = None) -> list[str]:
    """Apply the overrides that can be applied (each appended to ``applied``); the problems
    of those that cannot (never quoting a secret's value)."""
    problems: list[str] = []
    for text in overrides:
        try:
            path, value = parse_override(text)
        except ConfigError as e:
            problems += [redact_text(p) for p in e.problems]
            continue
        node = data
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                problems.append(f"override {_shown(path, value)!r}: "
                                f"{'.'.join(path[:i + 1])} is not a section")
                break
            node = nxt
        else:
            node[path[-1]] = value
            if applied is not None:
                applied.append((path, _given(text, path, value)))
    return problems


def _origin(loc: tuple[Any, ...], source: str, applied: Iterable[Applied]) -> str:
    """Who set the value an error at ``loc`` is about: the last ``--set`` whose key holds it
    (its value replaced the file's), else ``source``; a section error over a key an override
    set (a rule across its fields) names both."""
    at = [str(p) for p in loc]
    overrides = list(applied)
    for path, shown in reversed(overrides):
        if at[:len(path)] == path:
            return f"--set {shown}"
    inside = [shown for path, shown in overrides if at and path[:len(at)] == at]
    return f"{source} with --set {', '.join(inside)}" if inside else source


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a nested dict (creating intermediate dicts); one
    ConfigError lists every override that cannot be applied."""
    problems = _apply(data, overrides)
    if problems:
        raise ConfigError(problems)
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
    got = ""
    if "input" in err and not isinstance(err["input"], dict):
        # a secret's value is never quoted, whatever its type (a numeric token is a token)
        got = (" (the value is not shown: a secret)" if secret_at(tuple(err["loc"]))
               else f" (got {err['input']!r})")
    return f"{loc}: {err['msg']}{got}"


def validate(model: type[M], data: Mapping[str, Any], *, source: str = "config",
             problems: Iterable[str] = (), applied: Iterable[Applied] = ()) -> M:
    """Validate ``data`` against ``model``; raise one ConfigError listing every problem
    (``problems``: ones found before, e.g. overrides that could not be applied), each
    prefixed with where the bad value came from (``source``, or the ``--set`` of
    ``applied`` that set it), none of them showing a secret
    (:func:`astraflow.core.redact.redact_text`)."""
    found = list(problems)
    try:
        result = model.model_validate(dict(data))
    except pydantic.ValidationError as e:
        found += [f"{_origin(err['loc'], source, applied)}: {_hint(err, model)}"
                  for err in e.errors()]
    if found:
        raise ConfigError([redact_text(p) for p in found]) from None
    return result


def load(model: type[M], path: str | Path | None = None, overrides: Iterable[str] = ()) -> M:
    """Read a YAML file (or nothing), apply overrides, validate."""
    import yaml

    data: dict[str, Any] = {}
    source = "config"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            loaded = _yaml(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} not found") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{p}: not UTF-8 text ({e})") from None
        except OSError as e:  # a directory, no permission, ...
            raise ConfigError(f"config file {p} cannot be read: {e.strerror or e}") from None
        except yaml.YAMLError as e:  # its message quotes the line, which may hold a secret
            raise ConfigError(redact_text(f"{p}: not valid YAML: {e}")) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        data = loaded or {}
        if redacted_paths(data):  # a run directory's dump: its secrets are kept beside it
            restore(data, read_secrets(p.parent))
    applied: list[Applied] = []
    problems = _apply(data, overrides, applied)
    problems += [f"{source}: {k} is redacted ({REDACTED}) and no real value was found: a run "
                 f"directory keeps it in its {SECRETS_FILE} (mode 0600) beside the config; "
                 f"copy that file along, or give the real value in the config or with --set"
                 for k in redacted_paths(data)]
    return validate(model, data, source=source, problems=problems, applied=applied)


def dump(config: pydantic.BaseModel) -> str:
    """The resolved config as YAML (what ``astraflow config show`` prints), every secret
    (:mod:`astraflow.core.secrets`) shown as ``***``."""
    return dump_split(config)[0]


def dump_split(config: pydantic.BaseModel) -> tuple[str, list[tuple[tuple[str | int, ...], str]]]:
    """The redacted YAML of :func:`dump` and the secrets it hides, as (path, value) pairs
    (for :func:`astraflow.core.secrets.keep_secrets`)."""
    import yaml

    data, secrets = split(config.model_dump(mode="json"))
    return yaml.safe_dump(data, sort_keys=False), secrets
