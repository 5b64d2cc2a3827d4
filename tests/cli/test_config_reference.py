"""The configuration reference (docs/config.md) is the one the config models generate now, and
it is whole: every field of every section, the per-policy sections, each section introduced in
full."""

from __future__ import annotations

import re
import subprocess
import sys
import typing
from pathlib import Path

import pydantic
import pytest
import yaml

from astraflow.cli.config_reference import (
    FALLBACK_DESCRIPTIONS,
    FALLBACK_INTROS,
    reference_markdown,
    sections,
    type_text,
)
from astraflow.config import ExperimentConfig, load_experiment

ROOT = Path(__file__).resolve().parents[2]


def _keys(page: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", page, re.MULTILINE)


def test_docs_config_md_is_what_the_generator_writes() -> None:
    doc = (ROOT / "docs" / "config.md").read_text()
    assert doc == reference_markdown(), (
        "docs/config.md is stale: run `astraflow config reference > docs/config.md`")


def test_the_cli_prints_the_page() -> None:
    r = subprocess.run([sys.executable, "-m", "astraflow.cli.app", "config", "reference"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == reference_markdown()


def _models_in(ann: object) -> list[type[pydantic.BaseModel]]:
    """The sections a type holds: itself, an alternative of a union, a mapping's values."""
    if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        return [ann]
    args = typing.get_args(ann)
    if typing.get_origin(ann) is dict:
        args = args[1:]
    return [m for a in args for m in _models_in(a)]


def _leaves(model: type[pydantic.BaseModel], prefix: str = "") -> set[str]:
    """Every key the models define (a mapping's key as ``<*>``), walked here independently of
    the generator's walk."""
    found = set()
    for name, field in model.model_fields.items():
        key, ann = f"{prefix}{name}", field.annotation
        if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
            found |= _leaves(ann, key + ".")
            continue
        found.add(key)
        inner = f"{key}.<*>." if typing.get_origin(ann) is dict else f"{key}."
        for sub in _models_in(ann):
            found |= _leaves(sub, inner)
    return found


def _models(model: type[pydantic.BaseModel]) -> dict[str, type[pydantic.BaseModel]]:
    found = {model.__name__: model}
    for field in model.model_fields.values():
        for sub in _models_in(field.annotation):
            found |= _models(sub)
    return found


def test_every_field_of_every_section_has_a_row_with_a_description() -> None:
    page = reference_markdown()
    keys = _keys(page)
    assert len(keys) == len(set(keys))
    # placeholders (<policy>, <pool>) compared as one wildcard
    shown = {re.sub(r"<\w+>", "<*>", k) for k in keys}
    assert shown == _leaves(ExperimentConfig)
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]*)` \| ([^|]+?) \| (.*) \|$", page, re.MULTILINE)
    assert len(rows) == len(keys)
    assert [k for k, _, _, meaning in rows if not meaning.strip()] == []
    assert [k for k, type_, _, _ in rows if not type_] == []


def test_the_sections_the_reference_once_lacked_are_there() -> None:
    page = reference_markdown()
    for section in ("models.<policy>", "rollout.workflow", "trainer.lora", "bus.claims",
                    "weights.fetch", "weights.fallback", "launch.warmup.policies.<policy>",
                    "scale.pools.<pool>", "scale.pools.<pool>.actuator"):
        assert f"\n## `{section}`\n" in page, section
    for key in ("models.<policy>.path", "models.<policy>.build", "rollout.workflow.default",
                "rollout.workflow.kwargs", "trainer.lora.r", "scale.pools.<pool>.max_workers",
                "`trainer.loss.aggregation`", "`launch.rollout_workers`", "`data.batch_size`",
                "`rollout.engine.temperature`", "`weights.full_every`"):
        assert key in page, key


def test_every_section_is_introduced_whole() -> None:
    found = list(sections(ExperimentConfig))
    assert len(found) >= 40
    for section in found:
        assert section.intro, section.key
        # a docstring's sentences end; its first line alone often did not
        assert section.intro.rstrip().endswith((".", ")")), (section.key, section.intro)
        assert "``" not in section.intro and ":mod:" not in section.intro, section.key


def test_the_fallbacks_only_stand_in_for_what_the_models_lack() -> None:
    """A docstring or description added to a model makes its fallback here stale: delete it."""
    by_key = {s.key: s for s in sections(ExperimentConfig)}
    for key in FALLBACK_INTROS:
        assert not by_key[key].has_doc, f"{key} has a docstring now: drop FALLBACK_INTROS[{key!r}]"
    models = _models(ExperimentConfig)
    for name in FALLBACK_DESCRIPTIONS:
        model, field = name.split(".")
        assert field in models[model].model_fields, name
        assert not models[model].model_fields[field].description, (
            f"{name} has a description now: drop FALLBACK_DESCRIPTIONS[{name!r}]")


def test_defaults_are_yaml_that_a_config_takes_back() -> None:
    """Each scalar default, read as YAML, is the field's default (before the cross-section
    checks fill some in: data.assembler.group_size), and a config takes it back."""
    page = reference_markdown()
    defaults = ExperimentConfig.model_construct().model_dump(mode="json")
    rows = re.findall(r"^\| `([a-z_.]+)` \| `[^`]*` \| `([^`]*)` \|", page, re.MULTILINE)
    assert len(rows) > 150
    taken = []
    for key, shown in rows:
        value = defaults
        for part in key.split("."):
            value = value[part] if isinstance(value, dict) else None
        if value is None or isinstance(value, dict | list):
            continue
        assert yaml.safe_load(shown) == value, (key, shown, value)
        taken.append(f"{key}={shown}")
    load_experiment(None, taken)


@pytest.mark.parametrize(("ann", "text"), [
    (float | None, "float or null"),
    (list[str], "list[str]"),
    (tuple[float, float] | None, "[float, float] or null"),
    (dict[str, int], "dict[str, int]"),
])
def test_types_read_without_a_pipe(ann: object, text: str) -> None:
    assert type_text(ann) == text
