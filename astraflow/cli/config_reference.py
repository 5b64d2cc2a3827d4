"""The configuration reference (docs/config.md), generated from the config models themselves.

Every section of :class:`astraflow.config.ExperimentConfig` becomes a section of the page: its
model's docstring, then one row per field (key, type, default as YAML, description).
tests/cli/test_config_reference.py compares the page with what this module writes; regenerate
with ``astraflow config reference > docs/config.md``. Only the standard library at import time
(``astraflow --help`` imports this module); the config models load inside
:func:`reference_markdown`.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

HEADER = """# Configuration reference

Generated from the config models by `astraflow config reference > docs/config.md`; do not
edit (a test compares this page with the models).

An experiment is one YAML file; each section below is a mapping in it, nested as its key
reads: `trainer.optimizer.lr` is `lr` under `optimizer` under `trainer`. The same key path
sets a value from the command line: `--set trainer.optimizer.lr=1e-4` (the value is read as
YAML). Unknown keys are errors, and `astraflow check CONFIG` reports every problem of a file
at once, each with its key path. `astraflow config show CONFIG` prints a config with every
default below filled in.

A key in angle brackets is a name you choose: `models.<policy>` is one section per policy
named in `policies`, `scale.pools.<pool>` one per pool. Defaults are written as YAML; `null`
is YAML's none. In paths, `{out}` stands for the run directory (`runs/<run>` unless `--out`
says otherwise) and `{policy}` for the policy's name.
"""

#: what the key of a mapping of sections names, by the mapping's field name
KEY_NAMES = {"models": "policy", "policies": "policy", "pools": "pool"}

#: the introduction of a section whose model has no docstring (the docstring is preferred:
#: a test fails when an entry here is for a model that has one)
FALLBACK_INTROS = {
    "rollout.workflow": "Which workflow runs an episode of a task whose `workflow` field is "
                        "empty, the keyword arguments each workflow is called with, and the "
                        "modules imported at start to register workflows, rewards and tools "
                        "by name (docs/rollout.md#workflows).",
}

#: the description of a field that has none in its model, by "Model.field" (the model's own
#: description is preferred: a test fails when an entry here is for a field that has one)
FALLBACK_DESCRIPTIONS = {
    "ExperimentConfig.seed": "the run's seed, handed to the roles that draw at random (the "
                             "data policies, the evaluator's samples, the warm-up's "
                             "demonstrations)",
    "ModelConfig.seed": "with `build`: the seed of the tiny model's initial weights",
    "ArithmeticConfig.ops": "the operations the problems use",
    "ArithmeticConfig.min_value": "the smallest operand",
    "ArithmeticConfig.max_value": "the largest operand (every pair from min_value to "
                                  "max_value, per operation)",
    "ArithmeticConfig.split": "the split the tasks come from (test: the held-out problems)",
    "RewardConfig.kwargs": "keyword arguments the reward is called with, e.g. key: answer",
    "WeightSyncConfig.enabled": "follow weights.<policy> and load each new version; false: "
                                "the worker keeps the weights it started with",
    "StoreConfig.type": "file: a directory, local or a shared mount; http: a weight server "
                        "(`astraflow weights serve DIR`)",
}


@dataclass
class Section:
    """One section of the page: its key path, its introduction and its table's rows."""

    key: str
    intro: str
    rows: list[tuple[str, str, str, str]]  # key, type, default, description
    has_doc: bool


def _is_section(ann: Any) -> bool:
    import pydantic

    return isinstance(ann, type) and issubclass(ann, pydantic.BaseModel)


def type_text(ann: Any) -> str:
    """A field's type as the page shows it: Python's names, ``null`` for None, `` or ``
    between alternatives (no ``|``, which a Markdown table cell cannot hold in code), a
    section as ``section``."""
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if ann is type(None) or ann is None:
        return "null"
    if ann is Any:
        return "any"
    if _is_section(ann):
        return "section"
    if origin is typing.Literal:
        return " or ".join(_yaml(v) for v in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if origin is list:
        return f"list[{type_text(args[0])}]" if args else "list"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list[{type_text(args[0])}]"
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is dict:
        return f"dict[{type_text(args[0])}, {type_text(args[1])}]" if args else "dict"
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "")


def _float(value: float) -> str:
    """A float as YAML reads it back as a float (PyYAML takes ``1e-05`` for a string)."""
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    if math.isnan(value):
        return ".nan"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text


def _yaml(value: Any) -> str:
    """A default as YAML flow text (JSON-like, with YAML's floats); a section inside it shows
    only the keys whose values differ from that section's own defaults."""
    import pydantic

    if isinstance(value, pydantic.BaseModel):  # only what differs from its section's defaults
        value = value.model_dump(mode="json", exclude_defaults=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple, set, frozenset)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_yaml(str(k))}: {_yaml(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


def prose(text: str | None) -> str:
    """A docstring or description as Markdown: reST's ``literal`` and :role:`target` become
    code spans, ``docs/x.md`` a link from this page, a ``<`` outside code an entity."""
    text = inspect.cleandoc(text or "")
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    # outside code spans, "<policy>" would be read as an HTML tag and vanish
    text = "`".join(part if i % 2 else part.replace("<", "&lt;")
                    for i, part in enumerate(text.split("`")))
    return re.sub(r"(?<![\w/`])docs/([\w/.-]+\.md)(#[\w-]+)?",
                  lambda m: f"[docs/{m[1]}{m[2] or ''}]({m[1]}{m[2] or ''})", text)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(field: Any, value: Any, has_value: bool) -> str:
    if has_value:
        shown = value
    elif field.is_required():
        return "(required)"
    else:
        shown = field.default_factory() if field.default_factory is not None else field.default
    if _is_section(type(shown)):
        return "(below)"
    return f"`{_yaml(shown)}`"


def _sections_in(ann: Any) -> list[Any]:
    """The section types a field's type may hold directly or as a mapping's values."""
    if _is_section(ann):
        return [ann]
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        return [s for a in typing.get_args(ann) for s in _sections_in(a)]
    return []


def _mapping_of_sections(ann: Any) -> Any:
    """The section type of a ``dict[str, Section]`` (optionally ``| None``), else None."""
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        found = [_mapping_of_sections(a) for a in typing.get_args(ann)]
        return next((f for f in found if f is not None), None)
    if origin is dict:
        value = typing.get_args(ann)[1]
        return value if _is_section(value) else None
    return None


def sections(model: Any, key: str = "", value: Any = None) -> Iterator[Section]:
    """Every section of ``model`` (at ``key``, with the defaults of ``value``, the instance
    the enclosing section's default holds, when there is one), depth first."""
    rows = []
    nested: list[tuple[Any, str, Any]] = []
    for name, field in model.model_fields.items():
        path = f"{key}.{name}" if key else name
        has_value = value is not None
        current = getattr(value, name) if has_value else None
        description = prose(field.description
                            or FALLBACK_DESCRIPTIONS.get(f"{model.__name__}.{name}"))
        ann = field.annotation
        if _is_section(ann):
            nested.append((ann, path, current if has_value else _field_default(field)))
            continue
        inner = _sections_in(ann)
        mapped = _mapping_of_sections(ann)
        if inner:
            sub = inner[0]
            default = current if has_value else _field_default(field)
            nested.append((sub, path, default if isinstance(default, sub) else None))
            description = _join(description, f"fields: the section `{path}` below")
        elif mapped is not None:
            placeholder = f"{path}.<{KEY_NAMES.get(name, 'name')}>"
            nested.append((mapped, placeholder, None))
            description = _join(description, f"each value: the section `{placeholder}` below")
        rows.append((f"`{path}`", f"`{type_text(ann)}`", _default(field, current, has_value),
                     description))
    doc = model.__dict__.get("__doc__")
    intro = prose(doc) or prose(FALLBACK_INTROS.get(key, ""))
    yield Section(key or "(top level)", intro, rows, bool(doc and doc.strip()))
    for sub, path, sub_value in nested:
        yield from sections(sub, path, sub_value)


def _field_default(field: Any) -> Any:
    if field.is_required():
        return None
    return field.default_factory() if field.default_factory is not None else field.default


def _join(description: str, more: str) -> str:
    if not description:
        return more[0].upper() + more[1:]
    return f"{description.rstrip('.')}; {more}"


def reference_markdown() -> str:
    """The whole page: the hand-written introduction, then every section of the experiment
    config with its introduction and a row per key (type, default, description)."""
    from astraflow.config import ExperimentConfig

    lines = [HEADER]
    for section in sections(ExperimentConfig):
        lines += [f"## `{section.key}`", ""]
        if section.intro:
            lines += [section.intro, ""]
        if section.rows:
            lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
            lines += [f"| {k} | {t} | {d} | {_cell(m)} |" for k, t, d, m in section.rows]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown(), end="")
