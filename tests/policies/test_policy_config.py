"""The data section: stage orders checked at load with clear errors; user policies."""

from __future__ import annotations

import pytest
from policy_helpers import tgroup

from astraflow.config import ExperimentConfig
from astraflow.core.config import validate
from astraflow.core.errors import ConfigError
from astraflow.policies.config import BUILTINS, DataConfig
from astraflow.policies.registry import REGISTRY, build_chain, build_policies


def problems(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        validate(ExperimentConfig, {"data": data})
    return e.value.problems


def test_defaults_and_the_full_composition_validate() -> None:
    d = DataConfig()
    assert (d.pre_rollout, d.post_rollout, d.batch) == (["gate"], ["assembler", "staleness"],
                                                       ["batcher"])
    full = DataConfig(pre_rollout=["gate", "greso"], batch=["replay", "batcher"],
                      post_rollout=["assembler", "staleness", "dynamic_sampling"])
    for stage in ("pre_rollout", "post_rollout", "batch"):
        assert len(build_chain(full, stage).policies) == len(getattr(full, stage))
    assert DataConfig(pre_rollout=["greso", "gate"]).pre_rollout == ["greso", "gate"]
    assert DataConfig(pre_rollout=[], batch=["staleness", "batcher"]).pre_rollout == []


def test_every_order_problem_is_reported_at_once_with_its_path() -> None:
    found = problems({"pre_rollout": ["replay", "grso"],
                      "post_rollout": ["staleness", "assembler"],
                      "batch": ["replay", "staleness", "batcher"],
                      "greso": {"p_min": 0.9, "p_max": 0.5}})
    text = "\n".join(found)
    assert len(found) == 4
    assert "data.pre_rollout: [0]: replay runs in batch, not in pre_rollout" in text
    assert "[1]: unknown policy 'grso'; valid: gate, greso," in text
    assert "data.post_rollout: [0]: staleness takes TrajectoryGroup records but gets " \
           "Trajectory" in text
    assert "replay must come right before batcher" in text
    assert "p_min=0.9 is above p_max=0.5" in text


@pytest.mark.parametrize(("data", "message"), [
    ({"post_rollout": []}, "must end with TrajectoryGroup records"),
    ({"post_rollout": ["dynamic_sampling"]}, "put assembler before it"),
    ({"batch": ["replay"]}, "end it with batcher"),
    ({"batch": ["batcher", "staleness"]}, "staleness takes TrajectoryGroup records but gets "
                                          "Batch from batcher"),
    ({"batch": ["dynamic_sampling", "batcher"]}, "the gate counts what post_rollout drops"),
    ({"pre_rollout": ["gate", "gate"]}, "gate listed twice"),
    ({"pre_rollout": ["not a:path!"]}, "is not a 'module.path:factory' name"),
    ({"batch_size": 0}, "data.batch_size"),
])
def test_bad_orders_say_how_to_fix_them(data: dict, message: str) -> None:
    assert message in "\n".join(problems(data))


def test_registry_matches_the_specs_the_config_checks() -> None:
    assert set(REGISTRY) == set(BUILTINS)
    d = DataConfig()
    for stage in ("pre_rollout", "post_rollout", "batch"):
        for name, spec in BUILTINS.items():
            if stage in spec.stages:
                policy = REGISTRY[name](_env(d, stage))
                assert policy.consumes.schema_name() == spec.consumes
                assert policy.produces.schema_name() == spec.produces


def _env(d: DataConfig, stage: str):
    from astraflow.policies.env import BuildEnv

    return BuildEnv(data=d, stage=stage)


def test_user_policy_by_module_path_with_options() -> None:
    entry = "policy_custom:min_mean"
    d = DataConfig(post_rollout=["assembler", entry], options={entry: {"min_mean": 0.5}})
    chain = build_chain(d, "post_rollout")
    state = chain.states[1]
    out = [o for g in (tgroup("a", [1, 0]), tgroup("b", [0, 0, 1]))
           for o in chain.policies[1].process(g, state, chain.ctx)]
    assert [g.group_id for g in out] == ["a"]
    assert chain.counters() == {"assembler.open": 0, "min_mean.kept": 1, "min_mean.dropped": 1}


def test_user_policy_types_are_checked_when_built() -> None:
    d = DataConfig(post_rollout=["assembler", "policy_custom:task_policy"])
    with pytest.raises(ConfigError, match="task_policy takes Task records but gets "
                                          "TrajectoryGroup from assembler"):
        build_chain(d, "post_rollout")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        build_chain(DataConfig(pre_rollout=["no_such_module:f"]), "pre_rollout")
    with pytest.raises(ConfigError, match="has no callable 'nope'"):
        build_chain(DataConfig(pre_rollout=["policy_custom:nope"]), "pre_rollout")


def test_primary_policy_must_be_a_policy_of_the_run() -> None:
    with pytest.raises(ConfigError, match="'judge' is not one of policies"):
        build_policies(DataConfig(primary_policy="judge"), "pre_rollout",
                       policies=("solver",))


def test_per_policy_data_keys_must_name_policies_of_the_run() -> None:
    with pytest.raises(ConfigError) as e:
        validate(ExperimentConfig, {"policies": ["solver", "verifier"], "data": {
            "max_staleness_per_policy": {"verifier": 8, "verifer": 2},
            "batch_sizes": {"judge": 4}, "primary_policy": "critic"}})
    text = "\n".join(e.value.problems)
    for where, name in (("data.max_staleness_per_policy.verifer", "verifer"),
                        ("data.batch_sizes.judge", "judge"), ("data.primary_policy", "critic")):
        assert f"{where}: unknown policy {name!r}; valid (policies): solver, verifier" in text
    assert len(e.value.problems) == 3


def test_per_policy_staleness_bounds() -> None:
    cfg = validate(ExperimentConfig, {"policies": ["solver", "verifier"], "data": {
        "max_staleness": 3, "max_staleness_per_policy": {"verifier": 8}}})
    d = cfg.data
    assert (d.max_staleness_of("solver"), d.max_staleness_of("verifier")) == (3, 8)
    assert (d.max_staleness_of("solver", 1), d.max_staleness_of("verifier", 1)) == (1, 8)
    assert DataConfig().max_staleness_per_policy == {}  # one policy: one bound, as before
    assert any("data.max_staleness_per_policy" in p and ">= 0" in p
               for p in problems({"max_staleness_per_policy": {"default": -1}}))
