"""Fuzzing the experiment config loader (docs/results/faults.md#fuzzing): any YAML file and
any ``--set`` overrides give an ExperimentConfig or one ConfigError, never a raw pydantic ValidationError, a YAML
error, a KeyError or TypeError...; and every problem is reported at once, each at its path.

Documents are generated from the config models themselves (every section and key, with
values of the right type or of any type), so a new key is fuzzed without touching this
file; the settings (cases per target, the long profile) are in ``tests/fuzzing.py``.
"""

from __future__ import annotations

import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from fuzzing import fuzz
from hypothesis import event, example, given
from hypothesis import strategies as st

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.core.config import apply_overrides, load, parse_override
from astraflow.core.errors import ConfigError

POLICIES = ["default", "solver", "verifier"]
SCALARS = (st.none() | st.booleans() | st.integers(-5, 10) | st.integers()
           | st.floats(allow_nan=False, width=32) | st.text(max_size=8)
           | st.sampled_from(POLICIES + ["", "fixed", "token-mean", "kafka://h:1", "1e-3",
                                         "solver_verifier", "multi_turn_tools", "single_turn"]))
ANY_VALUE = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3)
                         | st.dictionaries(st.text(max_size=6) | st.sampled_from(POLICIES), kids,
                                           max_size=3), max_leaves=8)


def _unwrap(ann: Any) -> list[Any]:
    """The alternatives of an annotation (Optional, Union, Annotated unwrapped)."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(ann)[0])
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(ann) for a in _unwrap(arg)]
    return [ann]


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, pydantic.BaseModel)


WORDS = st.sampled_from(POLICIES + ["solver_verifier", "multi_turn_tools", "single_turn",
                                    "fixed", "kafka://h:1", "embedded://{out}/bus.db"])


def _value(ann: Any, depth: int) -> st.SearchStrategy[Any]:
    """A value for a field of annotation ``ann``: mostly of its own shape, now and then any."""
    options: list[st.SearchStrategy[Any]] = []
    for alt in _unwrap(ann):
        origin, args = typing.get_origin(alt), typing.get_args(alt)
        if _is_model(alt) and depth < 4:
            options.append(sections(alt, depth + 1))
        elif origin is dict and len(args) == 2 and depth < 4:
            options.append(st.dictionaries(st.sampled_from(POLICIES) | st.text(max_size=4),
                                           _value(args[1], depth + 1), max_size=2))
        elif origin in (list, tuple) and args and depth < 4:
            options.append(st.lists(_value(args[0], depth + 1), max_size=3))
        elif origin is typing.Literal:
            options.append(st.sampled_from(args))
        elif alt in (int, float):
            options.append(st.integers(-2, 100) | st.floats(-1, 10))
        elif alt is bool:
            options.append(st.booleans())
        elif alt is str:
            options.append(st.text(max_size=8) | WORDS)
        elif alt is type(None):
            options.append(st.none())
    typed = st.one_of(options) if options else ANY_VALUE
    return st.integers(0, 7).flatmap(lambda i: ANY_VALUE if i == 3 else typed)


@st.composite
def sections(draw: st.DrawFn, model: type[pydantic.BaseModel], depth: int = 0) -> dict[str, Any]:
    """A mapping for ``model``: some of its keys with values drawn by type, now and then an
    unknown key."""
    fields = model.model_fields
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True))
    out = {name: draw(_value(fields[name].annotation, depth)) for name in chosen}
    if draw(st.integers(0, 19)) == 7:  # not 0: hypothesis draws the bounds often
        out[draw(st.text(min_size=1, max_size=6))] = draw(SCALARS)
    return out


def _paths(model: type[pydantic.BaseModel], prefix: tuple[str, ...] = (), depth: int = 0
           ) -> list[tuple[str, ...]]:
    """Every key path of the config models (into per-policy dicts through a policy name)."""
    out = []
    for name, f in model.model_fields.items():
        path = (*prefix, name)
        out.append(path)
        for alt in _unwrap(f.annotation):
            args = typing.get_args(alt)
            if _is_model(alt) and depth < 4:
                out += _paths(alt, path, depth + 1)
            elif typing.get_origin(alt) is dict and len(args) == 2 and _is_model(args[1]):
                out += _paths(args[1], (*path, "solver"), depth + 1)
    return out


PATHS = sorted(set(_paths(ExperimentConfig)))
OVERRIDE_VALUES = st.sampled_from(["1", "-1", "0.5", "true", "null", "[]", "{}", "[a, b]",
                                   "{type: fixed}", "2020-13-45", "!!int x", "!!bool x",
                                   "[" * 800, "a: b: c", "'", "solver", "kafka://h:1", ""]) | (
    st.text(max_size=10))


@st.composite
def overrides(draw: st.DrawFn) -> list[str]:
    out = []
    for _ in range(draw(st.integers(0, 3))):
        path = ".".join(draw(st.sampled_from(PATHS)))
        if draw(st.integers(0, 9)) == 0:
            path = draw(st.sampled_from([path + ".x", path + "..", "", " ", path + "=",
                                         draw(st.text(max_size=6))]))
        out.append(f"{path}={draw(OVERRIDE_VALUES)}" if draw(st.integers(0, 19)) else path)
    return out


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _load(path: Path | None, sets: list[str]) -> ExperimentConfig | ConfigError:
    """The property: a config, or a ConfigError with at least one problem, each a line of
    text. Any other exception fails the test."""
    try:
        cfg = load_experiment(path, sets)
    except ConfigError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems)
        event("ConfigError")
        return e
    assert isinstance(cfg, ExperimentConfig)
    event("loaded")
    return cfg


@fuzz(150)
@given(sections(ExperimentConfig), overrides())
def test_generated_configs_load_or_give_config_errors(scratch: Path, doc: dict[str, Any],
                                                      sets: list[str]) -> None:
    f = scratch / "generated.yaml"
    f.write_text(yaml.safe_dump(doc))
    loaded = _load(f, sets)
    if not sets:  # the model alone fails only with ValidationError, which the loader converts
        try:
            ExperimentConfig.model_validate(yaml.safe_load(f.read_text()))
        except pydantic.ValidationError:
            assert isinstance(loaded, ConfigError)
        else:
            assert isinstance(loaded, ExperimentConfig)


#: PyYAML's safe loader raises ValueError for a date-like scalar that is no date, and
#: KeyError/AttributeError/IndexError for bad explicit tags, RecursionError past its nesting
#: limit; a file that is not UTF-8 or not a file raised UnicodeDecodeError/IsADirectoryError
BAD_TEXTS = ["seed: 2020-13-45\n", "seed: !!int x\n", "seed: !!bool x\n",
             "seed: !!timestamp x\n", "seed: !!int ':'\n", "[" * 800, "run: 2001-02-30\n"]


@fuzz(200)
@given(st.text(max_size=80) | st.sampled_from(BAD_TEXTS) | st.builds(
    yaml.safe_dump, ANY_VALUE))
@example(BAD_TEXTS[0])
@example(BAD_TEXTS[1])
@example(BAD_TEXTS[2])
@example(BAD_TEXTS[3])
@example(BAD_TEXTS[4])
@example(BAD_TEXTS[5])
def test_any_text_loads_or_gives_a_config_error(scratch: Path, text: str) -> None:
    f = scratch / "text.yaml"
    f.write_text(text)
    _load(f, [])


@fuzz(100)
@given(st.binary(max_size=40))
def test_any_bytes_load_or_give_a_config_error(scratch: Path, data: bytes) -> None:
    f = scratch / "bytes.yaml"
    f.write_bytes(data)
    _load(f, [])


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    for text in BAD_TEXTS:
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(ConfigError, match="c.yaml: not valid YAML"):
            load_experiment(tmp_path / "c.yaml")
    (tmp_path / "c.yaml").write_bytes(b"seed: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_experiment(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_experiment(tmp_path)


@fuzz(200)
@given(overrides())
@example(["seed=2020-13-45"])
@example(["seed=!!int x", "run=" + "[" * 800])
def test_any_overrides_give_a_config_or_a_config_error(sets: list[str]) -> None:
    for text in sets:
        try:
            parse_override(text)
        except ConfigError as e:
            assert "expected key.path=value" in str(e)
    _load(None, sets)


def test_a_value_yaml_cannot_read_is_a_string() -> None:
    assert parse_override("seed=2020-13-45") == (["seed"], "2020-13-45")
    assert parse_override("a=!!int x") == (["a"], "!!int x")
    with pytest.raises(ConfigError, match="seed: Input should be a valid integer") as err:
        load_experiment(None, ["seed=2020-13-45"])
    assert "'2020-13-45'" in str(err.value)


# ------------------------------------------------------------------------- all at once

def _section_paths() -> list[tuple[str, ...]]:
    """Key paths of sections (models) where an unknown key is refused with that path."""
    out: list[tuple[str, ...]] = [()]
    for path in PATHS:
        if "solver" in path:
            continue
        node: Any = ExperimentConfig
        for part in path:
            field = node.model_fields[part]
            models = [a for a in _unwrap(field.annotation) if _is_model(a)]
            if not models:
                break
            node = models[0]
        else:
            out.append(path)
    return out


SECTIONS = _section_paths()


@fuzz(100)
@given(st.lists(st.sampled_from(SECTIONS), min_size=1, max_size=6, unique=True),
       st.lists(st.sampled_from(["seed", "producer.n_samples", "trainer.optimizer.lr",
                                 "rollout.max_concurrent_episodes"]), max_size=2, unique=True),
       st.booleans())
def test_every_problem_is_reported_at_once(scratch: Path, bad_sections: list[tuple[str, ...]],
                                           bad_values: list[str], by_override: bool) -> None:
    """An unknown key in each of several sections and a bad value at several keys, in the
    file or as overrides, plus an override that cannot be applied: one ConfigError names
    every one of them at its path."""
    doc: dict[str, Any] = {"policies": ["default"]}
    sets = ["policies.x=1"]
    expected = ["override 'policies.x=1': policies is not a section"]
    for i, path in enumerate(bad_sections):
        key = f"zz_unknown_{i}"
        full = ".".join((*path, key))
        if by_override:
            sets.append(f"{full}=1")
        else:
            node = doc
            for part in path:
                node = node.setdefault(part, {})
            node[key] = 1
        expected.append(f"{full}: unknown key")
    for dotted in bad_values:
        sets.append(f"{dotted}=not-a-number")
        expected.append(f"{dotted}: ")
    f = scratch / "many.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        load_experiment(f, sets)
    text = "\n".join(err.value.problems)
    missing = [e for e in expected if e not in text]
    assert not missing, (missing, text)


def test_overrides_that_cannot_be_applied_are_reported_together() -> None:
    with pytest.raises(ConfigError) as err:
        apply_overrides({"run": "r", "seed": 1}, ["run.x=1", "novalue", "seed.y=2", "ok=1"])
    assert len(err.value.problems) == 3

def test_an_override_that_cannot_be_applied_is_reported_with_the_rest(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("run: r\n")
    with pytest.raises(ConfigError) as err:
        load(ExperimentConfig, tmp_path / "c.yaml", ["run.x=1", "seed=abc"])
    first, second = err.value.problems
    assert first == "override 'run.x=1': run is not a section"
    assert second.startswith("--set 'seed=abc': seed: Input should be a valid integer"), second
