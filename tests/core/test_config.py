from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.core.config import Section, apply_overrides, dump, load, parse_override
from astraflow.core.errors import ConfigError
from astraflow.run.resources import open_bus


class Inner(Section):
    lr: float = 1e-3
    agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"


class Outer(Section):
    run: str = "x"
    trainer: Inner = Inner()


def test_every_problem_is_reported_at_once_with_its_path(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("trainer:\n  lr: fast\n  agg: bad\n  oops: 1\nzzz: 2\n")
    with pytest.raises(ConfigError) as err:
        load(Outer, f)
    problems = err.value.problems
    assert len(problems) == 4
    text = "\n".join(problems)
    assert "trainer.lr" in text and "'fast'" in text
    assert "trainer.agg" in text and "'token-mean' or 'seq-mean-token-mean'" in text
    assert "trainer.oops: unknown key; valid keys here: agg, lr" in text
    assert "zzz: unknown key; valid keys here: run, trainer" in text


def test_overrides_parse_yaml_values_and_create_sections() -> None:
    assert parse_override("a.b=0.5") == (["a", "b"], 0.5)
    # YAML 1.1 reads 3e-4 as a string; the float field still gets a float
    assert load(Outer, None, ["trainer.lr=3e-4"]).trainer.lr == 3e-4
    assert parse_override("a=[x, y]") == (["a"], ["x", "y"])
    assert parse_override("a=true") == (["a"], True)
    assert apply_overrides({}, ["t.lr=0.5", "run=r"]) == {"t": {"lr": 0.5}, "run": "r"}
    with pytest.raises(ConfigError, match="expected key.path=value"):
        parse_override("novalue")
    with pytest.raises(ConfigError, match="run is not a section"):
        apply_overrides({"run": "r"}, ["run.x=1"])


def test_load_and_dump_round_trip(tmp_path: Path) -> None:
    cfg = load(Outer, None, ["trainer.lr=0.25"])
    f = tmp_path / "c.yaml"
    f.write_text(dump(cfg))
    assert load(Outer, f) == cfg


def test_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(Outer, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(Outer, bad)
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match="mapping"):
        load(Outer, bad)


def test_experiment_defaults_and_bus(tmp_path: Path) -> None:
    cfg = load_experiment(None, ["run=r1", "policies=[solver, verifier]"])
    assert isinstance(cfg, ExperimentConfig) and cfg.policies == ["solver", "verifier"]
    with pytest.raises(ConfigError, match="run"):
        load_experiment(None, ["run=bad name"])
    bus = open_bus(cfg, tmp_path)
    assert "af.r1.batches.verifier" in bus.list_topics()
    assert bus.url == f"embedded://{tmp_path.resolve()}/bus.db"
    bus.close()


def test_model_dir_builds_a_tiny_model_once(tmp_path: Path) -> None:
    from astraflow.run.resources import model_dir

    cfg = load_experiment(None, ["models.default.build=tiny-arith"])
    path = model_dir(cfg, "default", tmp_path)
    assert path == tmp_path.resolve() / "models" / "default"
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert model_dir(cfg, "default", tmp_path) == path
    assert (path / "config.json").stat().st_mtime_ns == stamp  # not rebuilt


def test_the_group_size_is_one_knob() -> None:
    """producer.n_samples is the samples per task; the assembler's fallback follows it."""
    from astraflow.config import ExperimentConfig

    cfg = ExperimentConfig.model_validate({"producer": {"n_samples": 5}})
    assert cfg.data.assembler.group_size == 5
    cfg = ExperimentConfig.model_validate({"producer": {"n_samples": 5},
                                           "data": {"assembler": {"group_size": 3}}})
    assert cfg.data.assembler.group_size == 3  # set on purpose (foreign trajectories)


def test_field_and_cross_section_errors_are_reported_together(tmp_path: Path) -> None:
    """Two bad fields (seed, trainer) and two bad combinations of sections that did validate
    (sampling at temperature 0; training on the held-out split): all four in one error."""
    f = tmp_path / "c.yaml"
    f.write_text("seed: many\n"
                 "trainer: {oops: 1}\n"
                 "rollout: {engine: {temperature: 0.0}}\n"
                 "launch: {eval_samples: 4}\n"
                 "producer: {source: arithmetic, arithmetic: {split: test}}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment(f)
    problems = err.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "seed: Input should be a valid integer" in text
    assert "trainer.oops: unknown key" in text
    assert "launch.eval_samples: eval_samples draws replies at rollout.engine.temperature" in text
    assert "producer.arithmetic.split: the producer would release the held-out problems" in text


def test_a_check_reading_a_failed_section_stays_silent(tmp_path: Path) -> None:
    """A bad ``launch`` is reported once: the checks that read it (eval_samples against the
    rollout temperature) do not run on its defaults; the others still do."""
    f = tmp_path / "c.yaml"
    f.write_text("launch: {eval_samples: 4, rollout_workers: 0}\n"
                 "rollout: {engine: {temperature: 0.0}, workflow: {kwargs: "
                 "{multi_turn_tools: {tool_latency: fast}}}}\n")
    with pytest.raises(ConfigError) as err:
        load_experiment(f)
    problems = err.value.problems
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{f}: launch.rollout_workers:")
    assert "rollout.workflow.kwargs.multi_turn_tools.tool_latency" in problems[1]


def test_a_bad_override_is_reported_as_the_override_not_as_the_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("trainer:\n  lr: 0.5\n")
    with pytest.raises(ConfigError) as err:
        load(Outer, f, ["trainer.lr=fast", "trainer.agg=[a, b]"])
    problems = err.value.problems
    assert problems[0].startswith("--set 'trainer.lr=fast': trainer.lr: "), problems
    # the argument as typed (not its parsed value), and never the file's name
    assert problems[1].startswith("--set 'trainer.agg=[a, b]': trainer.agg: "), problems
    assert not any(str(f) in p for p in problems)
    # the file's own mistake still names the file; the last override of a key wins
    f.write_text("trainer:\n  agg: bad\n")
    with pytest.raises(ConfigError) as err:
        load(Outer, f, ["trainer.lr=x", "trainer.lr=y"])
    assert sorted(err.value.problems)[0].startswith("--set 'trainer.lr=y': trainer.lr: ")
    assert sorted(err.value.problems)[1].startswith(f"{f}: trainer.agg: ")
    # a rule across a section's fields names the file and the override inside it
    with pytest.raises(ConfigError) as err:
        load_experiment(None, ["weights.store.type=http"])
    assert err.value.problems[0].startswith(
        "config with --set 'weights.store.type=http': weights.store: "), err.value.problems
    # a secret's value is never quoted, and the key and message stay whole
    with pytest.raises(ConfigError) as err:
        load_experiment(None, ["weights.store.token=[sekrit]"])
    assert err.value.problems[0].startswith("--set 'weights.store.token=***': "
                                            "weights.store.token: "), err.value.problems
    assert "sekrit" not in str(err.value)
