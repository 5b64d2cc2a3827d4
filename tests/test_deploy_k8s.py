"""The Kubernetes examples (deploy/k8s/, docs/elastic-cluster.md) cannot run here: these tests
parse them and check that they agree with each other and with the code — the experiment in
the ConfigMap loads, the actuator command names the rollout Deployment and renders, the RBAC
lets the scaler do what its commands do, KEDA watches the run's real group and topic."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from astraflow.consumers.scaler.actuators import CommandActuator, build_actuator
from astraflow.consumers.scaler.command import render
from astraflow.core.topics import group_name, topic_def, topic_name

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
FILES = ("rollout-deployment.yaml", "scaler-command.yaml", "keda-scaledobject.yaml")


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def one(name: str, kind: str, obj: str | None = None) -> dict[str, Any]:
    found = [d for d in docs(name) if d["kind"] == kind
             and (obj is None or d["metadata"]["name"] == obj)]
    assert len(found) == 1, f"{name}: {len(found)} {kind} {obj or ''}"
    return found[0]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from astraflow.config import load_experiment

    cm = one("rollout-deployment.yaml", "ConfigMap")
    path = tmp_path_factory.mktemp("k8s") / "experiment.yaml"
    path.write_text(cm["data"]["experiment.yaml"])
    return load_experiment(path, [])


def container(dep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_every_file_parses_into_named_objects() -> None:
    for name in FILES:
        for d in docs(name):
            assert d["apiVersion"] and d["kind"] and d["metadata"]["name"], name


def test_rollout_deployment_runs_the_worker_on_the_configmap() -> None:
    cm = one("rollout-deployment.yaml", "ConfigMap")
    dep = one("rollout-deployment.yaml", "Deployment", "astraflow-rollout")
    pod = dep["spec"]["template"]["spec"]
    c = container(dep, "rollout")
    assert c["args"][:2] == ["rollout", "/config/experiment.yaml"]
    assert "--out" in c["args"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/config")
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= \
        dep["spec"]["template"]["metadata"]["labels"].items()
    assert pod["terminationGracePeriodSeconds"] >= 30  # the worker drains on SIGTERM


def test_the_configmap_experiment_loads_on_kafka(experiment: Any) -> None:
    assert experiment.bus.url.startswith("kafka://")
    assert experiment.weights.fetch is not None and experiment.weights.fetch.type == "http"


def test_the_command_actuator_scales_the_rollout_deployment(experiment: Any) -> None:
    pool = experiment.scale.pools["rollout"]
    act = build_actuator(pool.actuator, run=experiment.run, pool="rollout")
    assert isinstance(act, CommandActuator)
    dep = one("rollout-deployment.yaml", "Deployment", "astraflow-rollout")
    name = dep["metadata"]["name"]
    cmd = shlex.split(render(act.command, {"target": 5, "current": 2, "pool": "rollout",
                                           "run": experiment.run}))
    assert cmd == ["kubectl", "scale", f"deployment/{name}", "--replicas=5"]
    assert act.count_command is not None
    count = shlex.split(render(act.count_command, {"pool": "rollout", "run": experiment.run}))
    assert count == ["kubectl", "get", f"deployment/{name}", "-o", "jsonpath={.spec.replicas}"]
    assert pool.min_workers <= dep["spec"]["replicas"] <= pool.max_workers


def test_the_scaler_may_get_and_scale_the_deployment_and_nothing_else() -> None:
    role = one("scaler-command.yaml", "Role")
    binding = one("scaler-command.yaml", "RoleBinding")
    sa = one("scaler-command.yaml", "ServiceAccount")
    scaler = one("scaler-command.yaml", "Deployment", "astraflow-scaler")
    pod = scaler["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert {"kind": "ServiceAccount", "name": sa["metadata"]["name"]} in binding["subjects"]
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]
              if rule["apiGroups"] == ["apps"]
              and rule.get("resourceNames", ["astraflow-rollout"]) == ["astraflow-rollout"]}
    assert {("deployments", "get"), ("deployments/scale", "patch")} <= grants
    assert {r for r, _ in grants} == {"deployments", "deployments/scale"}
    assert not any(v in ("*", "delete", "create") for _, v in grants)
    assert scaler["spec"]["replicas"] == 1
    assert container(scaler, "scale")["args"][:2] == ["scale", "/config/experiment.yaml"]
    assert container(scaler, "report")["args"][:2] == ["report", "/config/experiment.yaml"]


def test_keda_watches_the_runs_rollout_group_on_its_tasks_topic(experiment: Any) -> None:
    so = one("keda-scaledobject.yaml", "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == "astraflow-rollout"
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["consumerGroup"] == group_name(experiment.run, "rollout")
    assert meta["topic"] == topic_name(experiment.run, "tasks")
    assert meta["bootstrapServers"] == experiment.bus.url.removeprefix("kafka://")
    assert int(meta["lagThreshold"]) >= 1
    assert set(meta) <= {"bootstrapServers", "consumerGroup", "topic", "lagThreshold",
                         "activationLagThreshold", "offsetResetPolicy", "allowIdleConsumers",
                         "scaleToZeroOnInvalidOffset", "excludePersistentLag"}
    partitions = experiment.bus.partitions.get("tasks", topic_def("tasks").partitions)
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions


def test_the_doc_shows_every_file_and_the_actuator_snippet() -> None:
    text = (ROOT / "docs" / "elastic-cluster.md").read_text()
    for name in FILES:
        assert f"deploy/k8s/{name}" in text, name
    assert "--replicas={target}" in text and "count_command" in text
