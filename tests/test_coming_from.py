"""docs/coming-from.md, the map from TRL, verl and AReaL options to AstraFlow's keys: every
AstraFlow key the page names is a key of the experiment config, each row's settings load
together as one config, and each framework's best-known options have a row. A key renamed or
removed in the config models fails here until the page follows."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.core.errors import ConfigError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "coming-from.md"

#: what a name in angle brackets stands for when a row's settings are loaded
PLACEHOLDERS = {"<policy>": "default", "<pool>": "rollout"}

#: the options each framework's table must map (a whole option name inside a backticked span
#: of its first column)
REQUIRED = {
    "TRL": ["num_generations", "beta", "epsilon", "epsilon_high", "max_completion_length",
            "max_prompt_length", "learning_rate", "per_device_train_batch_size",
            "gradient_accumulation_steps", "temperature", "loss_type", "scale_rewards",
            "num_iterations", "use_vllm"],
    "verl": ["actor_rollout_ref.rollout.n", "data.train_batch_size",
             "actor_rollout_ref.actor.ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu",
             "clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "kl_loss_coef",
             "use_kl_loss", "kl_loss_type", "entropy_coeff", "algorithm.adv_estimator",
             "data.max_response_length", "actor.optim.lr", "loss_agg_mode",
             "trainer.total_training_steps", "rollout.tensor_model_parallel_size"],
    "AReaL": ["gconfig.n_samples", "max_head_offpolicyness", "actor.eps_clip", "actor.kl_ctl",
              "train_dataset.batch_size", "actor.optimizer.lr", "gconfig.max_new_tokens",
              "actor.recompute_logprob", "actor.use_decoupled_loss"],
}

SPAN = re.compile(r"`([^`]+)`")
SETTING = re.compile(r"([A-Za-z_<][\w.<>]*): (.+)")


def tables(text: str) -> dict[str, list[list[str]]]:
    """The page's mapping tables (those whose second header cell is ``AstraFlow``), by the
    framework their first header cell names: each a list of rows of cells."""
    found: dict[str, list[list[str]]] = {}
    block: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) > 2 and block[0][1:2] == ["AstraFlow"]:
            found[block[0][0]] = [row for row in block[2:]]
        block = []
    return found


def _section(ann: Any) -> type[pydantic.BaseModel] | None:
    """The section a field holds: its type, or the section of ``Section | None``."""
    if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        return ann
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(ann) if a is not type(None)]
        return _section(inner[0]) if len(inner) == 1 else None
    return None


def _mapping_value(ann: Any) -> Any:
    """The value type of a mapping field (``dict[str, X]``, or one that may be null), or None
    when the field is no mapping."""
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(ann) if a is not type(None)]
        return _mapping_value(inner[0]) if len(inner) == 1 else None
    if typing.get_origin(ann) is dict:
        return typing.get_args(ann)[1]
    return None


def key_problem(key: str) -> str | None:
    """Why ``key`` is no key path of :class:`ExperimentConfig` (None when it is one). A name in
    a mapping of sections (``models.<policy>``) may be anything; the keys inside a free mapping
    (``rollout.engine.vllm_args``) are the library's it feeds, not ours, and are not checked."""
    ann: Any = ExperimentConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        if ann is Any:
            return None
        section = _section(ann)
        if section is not None:
            if part not in section.model_fields:
                return f"{where}: no such key in {section.__name__}"
            ann = section.model_fields[part].annotation
            if section is ExperimentConfig and part == "trainers":  # partial trainer sections
                ann = dict[str, TrainerConfig]
            continue
        value = _mapping_value(ann)
        if value is None:
            return f"{where}: {'.'.join(parts[:i])} is a value, not a section"
        ann = value
    return None


def row_problems(row: list[str]) -> list[str]:
    """What is wrong with one table row: an AstraFlow cell whose backticked spans are not
    ``key: value`` settings, a key that is not a key, a key set twice, settings that do not
    load together; a dotted span of the note that names an unknown key of ours."""
    option, ours, note = row[0], row[1], row[2] if len(row) > 2 else ""
    problems, settings = [], []
    for span in SPAN.findall(ours):
        m = SETTING.fullmatch(span)
        if m is None:
            problems.append(f"{option}: `{span}` is not written `key: value`")
            continue
        settings.append((m.group(1), m.group(2)))
    keys = [k for k, _ in settings]
    problems += [f"{option}: {k} is set twice in one row" for k in set(keys) if keys.count(k) > 1]
    top = set(ExperimentConfig.model_fields)
    named = keys + [s.split(": ")[0] for s in SPAN.findall(note)
                    if re.fullmatch(r"[\w.<>]+(: .+)?", s) and "." in s.split(": ")[0]
                    and s.split(".")[0] in top]
    problems += [f"{option}: {p}" for k in named if (p := key_problem(k))]
    if settings and not problems:
        overrides = []
        for key, value in settings:
            for placeholder, name in PLACEHOLDERS.items():
                key = key.replace(placeholder, name)
            overrides.append(f"{key}={value}")
        try:
            load_experiment(None, overrides)
        except ConfigError as e:
            problems.append(f"{option}: {overrides} does not load: {e}")
    return problems


@pytest.fixture(scope="module")
def page_tables() -> dict[str, list[list[str]]]:
    return tables(PAGE.read_text())


def test_the_page_has_a_table_per_framework(page_tables: dict[str, list[list[str]]]) -> None:
    assert set(page_tables) == set(REQUIRED)


def test_every_key_exists_and_every_row_loads(page_tables: dict[str, list[list[str]]]) -> None:
    problems = [p for rows in page_tables.values() for row in rows for p in row_problems(row)]
    assert not problems, "docs/coming-from.md:\n" + "\n".join(problems)


def test_the_best_known_options_have_a_row(page_tables: dict[str, list[list[str]]]) -> None:
    missing = []
    for framework, names in REQUIRED.items():
        options = [s for row in page_tables[framework] for s in SPAN.findall(row[0])]
        missing += [f"{framework}: {name}" for name in names
                    if not any(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", s)
                               for s in options)]
    assert not missing, "no row for: " + ", ".join(missing)


def test_the_yaml_example_loads(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.yaml"
        path.write_text(block)
        load_experiment(path)


def test_the_check_catches_what_it_should() -> None:
    assert row_problems(["`x`", "`trainer.loss.eps_low: 0.2`", ""]) == []
    assert row_problems(["`x`", "`models.<policy>.path: org/model`", ""]) == []
    assert row_problems(["`x`", "`trainers.<policy>.optimizer.lr: 1.0e-5`", ""]) == []
    assert row_problems(["`x`", "`rollout.engine.vllm_args.tensor_parallel_size: 2`", ""]) == []
    assert "no such key" in row_problems(["`x`", "`trainer.loss.epsilon: 0.2`", ""])[0]
    assert "no such key" in row_problems(["`x`", "`trainers.<policy>.loss.clip: 1`", ""])[0]
    assert "no such key" in row_problems(["`x`", "none", "see `data.max_stale`"])[0]
    assert "not written" in row_problems(["`x`", "`trainer.loss.eps_low`", ""])[0]
    assert "twice" in row_problems(["`x`", "`producer.n_samples: 2`, `producer.n_samples: 4`",
                                     ""])[0]
    assert "does not load" in row_problems(["`x`", "`trainer.loss.kl: k4`", ""])[0]
    assert "does not load" in row_problems(["`x`", "`trainer.loss.kl: k3`", ""])[0]  # coef 0
    assert row_problems(["`x`", "none", "verl's `actor.optim.lr`, `vllm.LLM`"]) == []
