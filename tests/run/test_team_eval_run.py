"""`astraflow run` with a solver_verifier team: the roles it starts (one evaluator per policy
and the team's), when it stops on launch.stop_at_accuracy, when the final evaluations are in,
and where it exports each policy's checkpoint — judged from real Metric records on an
embedded bus."""

from __future__ import annotations

from pathlib import Path

from astraflow.config import ExperimentConfig, load_experiment
from astraflow.core.bus import connect
from astraflow.core.metrics import MetricsEmitter, component_id
from astraflow.core.topics import run_topics
from astraflow.run.collector import Collector
from astraflow.run.launch import rl_roles
from astraflow.run.orchestrate import _evaluated, _reached, export_final

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "solver_verifier.yaml"


def team_config(*sets: str) -> ExperimentConfig:
    return load_experiment(EXAMPLE, list(sets))


def test_a_team_run_starts_an_evaluator_per_policy_and_the_teams(tmp_path: Path) -> None:
    names = [r.name for r in rl_roles(team_config(), tmp_path / "c.yaml", tmp_path)]
    assert {"evaluator-solver", "evaluator-verifier", "evaluator-team"} <= set(names)
    team = next(r for r in rl_roles(team_config(), tmp_path / "c.yaml", tmp_path)
                if r.name == "evaluator-team")
    assert "--team" in team.argv
    assert "evaluator-team" not in [r.name for r in rl_roles(
        team_config("launch.evaluate=false"), tmp_path / "c.yaml", tmp_path)]
    single = ExperimentConfig.model_validate({"run": "r"})
    assert [r.name for r in rl_roles(single, tmp_path / "c.yaml", tmp_path)
            if r.name.startswith("evaluator")] == ["evaluator-default"]


def test_stop_and_final_evaluation_wait_for_every_policy_and_the_team(tmp_path: Path) -> None:
    cfg = team_config("launch.stop_at_accuracy=0.4")
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics(cfg.run, cfg.policies))
    col = Collector(bus, cfg.run, policies=cfg.policies)
    ev = {p: MetricsEmitter(bus, run=cfg.run, role="evaluator", component=f"evaluator-{p}")
          for p in cfg.policies}
    team = MetricsEmitter(bus, run=cfg.run, role="evaluator-team", component="evaluator-team")
    try:
        def measure(policy: str, step: int, acc: float) -> None:
            ev[policy].set("eval_step", step)
            ev[policy].set("eval_accuracy", acc)
            ev[policy].emit()
            col.poll(1.0)

        def measure_team(solver: int, verifier: int, acc: float) -> None:
            team.set("system_accuracy", acc)
            team.set("version.solver", solver)
            team.set("version.verifier", verifier)
            team.set("eval_step", solver)
            team.emit()
            col.poll(1.0)

        measure("solver", 10, 0.5)
        measure("verifier", 8, 0.6)
        assert not _reached(cfg, col)  # the team has not been measured
        measure_team(10, 8, 0.39)
        assert not _reached(cfg, col)
        measure_team(12, 8, 0.41)
        assert _reached(cfg, col)
        measure("verifier", 9, 0.35)  # the newest evaluation counts
        assert not _reached(cfg, col)

        final = {"solver": 12, "verifier": 9}
        assert not _evaluated(cfg, col, final)  # the solver's evaluator is at 10
        measure("solver", 12, 0.5)
        assert not _evaluated(cfg, col, final)  # the team evaluated verifier version 8
        measure_team(12, 9, 0.45)
        assert _evaluated(cfg, col, final)
        # a restarted evaluator is a new component: the newest of each policy is the one read
        again = MetricsEmitter(bus, run=cfg.run, role="evaluator",
                               component=component_id("evaluator-solver"))
        again.set("eval_step", 0)
        again.set("eval_accuracy", 0.1)
        again.emit()
        col.poll(1.0)
        assert col.evaluators()["solver"].metric.component == again.component
        assert not _evaluated(cfg, col, final)
        again.close()
    finally:
        for m in (*ev.values(), team):
            m.close()
        col.close()
        bus.close()


def test_export_final_uses_each_policys_own_checkpoint_dir(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from astraflow.models.tiny import load
    from astraflow.run.resources import model_dir

    cfg = team_config("trainers.verifier.checkpoint_dir={out}/elsewhere/{policy}")
    roots = {p: cfg.trainer_for(p).checkpoint_root(tmp_path, p) for p in cfg.policies}
    assert roots["verifier"] == tmp_path / "elsewhere" / "verifier"
    assert roots["solver"] != roots["verifier"]
    for p, root in roots.items():
        model, _ = load(model_dir(cfg, p, tmp_path))
        ck = root / "step-0000000005"
        ck.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()
                   if k != "lm_head.weight"}, str(ck / "model.safetensors"))
    exported = export_final(cfg, tmp_path)
    assert set(exported) == {"solver", "verifier"}
    assert all((tmp_path / "final" / p / "model.safetensors").is_file() for p in exported)


def test_lines_name_the_policy_of_trainers_and_evaluators(tmp_path: Path) -> None:
    import json

    cfg = team_config()
    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics(cfg.run, cfg.policies))
    col = Collector(bus, cfg.run, jsonl=tmp_path / "metrics.jsonl", policies=cfg.policies)
    named = MetricsEmitter(bus, run=cfg.run, role="trainer",
                           component=component_id("trainer-verifier"))
    anonymous = MetricsEmitter(bus, run=cfg.run, role="trainer")  # component "trainer-<host>..."
    ev = MetricsEmitter(bus, run=cfg.run, role="evaluator",
                        component=component_id("evaluator-solver"))
    try:
        for m in (named, anonymous):
            m.set("step", 3)
            m.set("reward_mean", 0.5)
            m.emit()
        ev.set("eval_step", 3)
        ev.set("eval_accuracy", 0.25)
        ev.emit()
        for _ in range(5):
            if col.poll(1.0) == 0 and len(col.components) == 3:
                break
        rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert {(r["source"], r.get("policy")) for r in rows} == {
            (named.component, "verifier"), (anonymous.component, None),
            (ev.component, "solver")}
        assert col.trainer_step("verifier") == 3 and col.trainer_step("solver") == 0
    finally:
        for m in (named, anonymous, ev):
            m.close()
        col.close()
        bus.close()


def test_final_versions_from_named_trainers_else_the_weights_topic(tmp_path: Path) -> None:
    """The final evaluation waits for each policy's final version: its trainer's step where
    the trainer's component names the policy, else the newest manifest on weights.<policy>."""
    import torch

    from astraflow.run.orchestrate import _final_versions
    from astraflow.run.resources import open_bus
    from astraflow.run.roles import configured_publisher

    cfg = team_config()
    bus = open_bus(cfg, tmp_path)
    col = Collector(bus, cfg.run, policies=cfg.policies)
    solver = MetricsEmitter(bus, run=cfg.run, role="trainer",
                            component=component_id("trainer-solver"))
    pub = configured_publisher(cfg, "verifier", tmp_path, bus)
    try:
        assert _final_versions(cfg, col) == {"solver": 0, "verifier": 0}  # nothing yet
        solver.set("step", 5)
        solver.emit()
        for v in (1, 2, 3):
            pub.publish({"w": torch.full((8,), float(v))}, v)
        pub.flush(timeout=30)
        col.poll(1.0)
        assert _final_versions(cfg, col) == {"solver": 5, "verifier": 3}
    finally:
        pub.close()
        solver.close()
        col.close()
        bus.close()
