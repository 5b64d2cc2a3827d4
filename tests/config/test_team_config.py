"""A team config names a policy for every role of its workflow: refused at load time, each
problem at the key that names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from astraflow.config import load_experiment
from astraflow.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TEAM = ROOT / "examples" / "solver_verifier.yaml"


def refused(*sets: str) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_experiment(TEAM, sets)
    return e.value.problems


def test_the_demo_maps_each_role_to_its_policy() -> None:
    c = load_experiment(TEAM)
    assert c.team() == {"solver": "solver", "verifier": "verifier"}
    assert c.role_of("verifier") == "verifier" and c.role_of("nobody") is None


def test_a_role_without_a_policy_is_refused_at_policies() -> None:
    (problem,) = refused("policies=[solver]", "models={solver: {build: tiny-team}}",
                         "trainers={}", "launch.warmup.policies={}")
    assert "policies: workflow 'solver_verifier' role 'verifier' is played by policy " \
           "'verifier', which is not in policies (solver)" in problem


def test_a_role_mapped_to_a_missing_policy_is_refused_at_its_key() -> None:
    (problem,) = refused("rollout.workflow.kwargs.solver_verifier.policies={verifier: judge}")
    assert "rollout.workflow.kwargs.solver_verifier.policies.verifier: workflow " \
           "'solver_verifier' role 'verifier' is played by policy 'judge'" in problem


def test_an_unknown_role_is_refused_at_its_key() -> None:
    (problem,) = refused("rollout.workflow.kwargs.solver_verifier.policies={judge: verifier}")
    assert "policies.judge: workflow 'solver_verifier' has no role 'judge'" in problem


def test_a_trainer_section_for_no_policy_is_refused_at_its_key() -> None:
    (problem,) = refused("trainers.critic={optimizer: {lr: 1.0e-4}}")
    assert "trainers.critic: unknown policy 'critic'" in problem


def test_a_bad_verifier_latency_is_refused_at_load_time() -> None:
    (problem,) = refused(
        "rollout.workflow.kwargs.solver_verifier.verifier_latency={dist: lognormal}")
    assert "kwargs.solver_verifier.verifier_latency" in problem and "'type'" in problem


def test_columns_work_needs_an_addition_task() -> None:
    (problem,) = refused("launch.warmup.verifier_work=columns",
                         "producer.arithmetic.ops=['*']")
    assert "launch.warmup.verifier_work: verifier_work columns writes an addition's column " \
           "sums" in problem and "ops ['*']" in problem
    cols = load_experiment(ROOT / "examples" / "solver_verifier_columns.yaml")
    assert cols.launch.warmup.verifier_work == "columns"
    assert load_experiment(TEAM).launch.warmup.verifier_work == "sum"


def test_a_tool_check_names_a_registered_tool_and_extractor() -> None:
    kw = "rollout.workflow.kwargs.solver_verifier"
    (problem,) = refused(f"{kw}.verifier_tool=abacus")
    assert f"{kw}.verifier_tool: unknown tool 'abacus'; registered: " in problem
    assert "calculator" in problem
    (problem,) = refused(f"{kw}.answer_extract=last_digit")
    assert f"{kw}.answer_extract: unknown answer extractor 'last_digit'" in problem
    (problem,) = refused(f"{kw}.tool_verdict=true")
    assert f"{kw}.tool_verdict: tool_verdict compares the claim with the tool's answer" in problem
    team = load_experiment(ROOT / "examples" / "smollm2_team.yaml")  # the shipped example
    assert team.team_kwargs()["verifier_tool"] == "calculator"
