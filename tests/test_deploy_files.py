"""The Docker development stack (compose.yaml, Dockerfile, deploy/**) cannot run here: these tests
parse every file and check that they agree with each other and with the repository."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = {"produce", "rollout", "policy", "train", "evaluate", "topics"}
ROLE_SUBCOMMANDS = SUBCOMMANDS - {"topics"}  # long-running, configured by an experiment file
METRIC = re.compile(r"\bastraflow_[A-Za-z0-9_]+")
APP_DIR = "/app/"  # where the Dockerfile puts the repository's files in the image


# ---------------------------------------------------------------- helpers


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command", [])
    return cmd.split() if isinstance(cmd, str) else [str(x) for x in cmd]


def astraflow_services() -> dict[str, dict[str, Any]]:
    """Services that run the astraflow image (their command is an astraflow subcommand)."""
    return {n: s for n, s in services().items() if "build" in s}


def role_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in astraflow_services().items() if command(s)[:1]
            and command(s)[0] in ROLE_SUBCOMMANDS}


def mounts(svc: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of each volume entry, short or long syntax."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out.append((str(v.get("source", "")), str(v["target"])))
        else:
            parts = str(v).split(":")
            out.append((parts[0], parts[1]))
    return out


def bind_source(source: str) -> Path | None:
    """The repository path of a bind mount (None for a named volume)."""
    if source.startswith(("./", "../", "/")):
        return (ROOT / source).resolve()
    return None


def host_path_of(svc: dict[str, Any], container_path: str) -> Path:
    """Map a path inside a service's container to the repository path it comes from: through
    the service's bind mounts first, else through the image's /app (a copy of the repo)."""
    best = None
    for source, target in mounts(svc):
        host = bind_source(source)
        inside = container_path == target or container_path.startswith(target.rstrip("/") + "/")
        if host is not None and inside and (best is None or len(target) > len(best[1])):
            best = (host, target)
    if best is not None:
        rest = container_path[len(best[1]):].lstrip("/")
        return best[0] / rest if rest else best[0]
    assert container_path.startswith(APP_DIR), f"{container_path} is neither mounted nor in /app"
    return ROOT / container_path[len(APP_DIR):]


def config_arg(cmd: list[str]) -> str:
    """The experiment config argument of a role command: the first `.yaml`/`.yml` argument."""
    paths = [a for a in cmd if a.endswith((".yaml", ".yml")) and not a.startswith("-")]
    assert paths, f"no config path in {cmd}"
    return paths[0]


def overrides(cmd: list[str]) -> dict[str, str]:
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    return dict(s.split("=", 1) for s in sets)


def prometheus() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())


def dashboard() -> dict[str, Any]:
    return json.loads((ROOT / "deploy/grafana/dashboards/astraflow.json").read_text())


def panels() -> list[dict[str, Any]]:
    out = []
    for p in dashboard()["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows hold their panels
    return out


def documented_metrics() -> set[str]:
    text = (ROOT / "docs/operations.md").read_text()
    return set(re.findall(r"`(astraflow_[A-Za-z0-9_]+)`", text))


# ---------------------------------------------------------------- compose


def test_compose_parses_and_every_service_has_an_image() -> None:
    doc = compose()
    assert doc["services"], "no services"
    for name, svc in doc["services"].items():
        assert svc.get("image") or svc.get("build"), f"service {name}: neither image nor build"
        if "build" in svc:
            build = svc["build"]
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile",
                                                                                "Dockerfile")
            assert (context / dockerfile).is_file(), f"service {name}: no {dockerfile}"


def test_the_stack_has_kafka_the_roles_prometheus_and_grafana() -> None:
    names = set(services())
    assert {"kafka", "topics", "prometheus", "grafana"} <= names
    subcommands = {command(s)[0] for s in astraflow_services().values()}
    assert subcommands == SUBCOMMANDS, f"roles missing: {SUBCOMMANDS - subcommands}"
    stages = {c[2] for s in role_services().values() if (c := command(s))[0] == "policy"}
    assert stages == {"pre_rollout", "post_rollout", "batch"}


def test_every_mounted_or_configured_file_exists() -> None:
    doc = compose()
    volumes = set(doc.get("volumes") or {})
    for name, svc in doc["services"].items():
        for source, target in mounts(svc):
            host = bind_source(source)
            if host is None:
                assert source in volumes, f"service {name}: named volume {source} not declared"
            else:
                assert host.exists(), f"service {name}: mounts {source}, which does not exist"
                assert ROOT in host.parents, f"service {name}: {source} is outside the repo"
            assert target.startswith("/"), f"service {name}: mount target {target}"
    for name, cfg in (doc.get("configs") or {}).items():
        if "file" in cfg:
            assert (ROOT / cfg["file"]).is_file(), f"config {name}: {cfg['file']} missing"


def test_every_astraflow_service_runs_a_known_subcommand() -> None:
    for name, svc in astraflow_services().items():
        cmd = command(svc)
        assert cmd and cmd[0] in SUBCOMMANDS, f"service {name}: command {cmd}"


def test_every_role_names_a_config_in_the_image_a_run_dir_and_the_kafka_bus() -> None:
    kafka_env = services()["kafka"]["environment"]
    internal = [a.split("//")[1] for a in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")
                if a.startswith("INTERNAL://")][0]
    for name, svc in role_services().items():
        cmd = command(svc)
        path = config_arg(cmd)
        assert path.startswith(APP_DIR + "examples/"), f"service {name}: config {path}"
        assert cmd[1] == path, f"service {name}: the config must be the first argument: {cmd}"
        assert "--out" in cmd, f"service {name}: no --out run directory"
        out = cmd[cmd.index("--out") + 1]
        assert any(out.startswith(t.rstrip("/") + "/") or out == t
                   for s, t in mounts(svc) if bind_source(s) is None), \
            f"service {name}: run directory {out} is not on a named volume"
        assert overrides(cmd).get("bus.url") == f"kafka://{internal}", f"service {name}: bus"


def test_all_roles_share_one_run_directory_volume_and_the_metrics_port() -> None:
    outs, volumes = set(), set()
    for name, svc in role_services().items():
        cmd = command(svc)
        outs.add(cmd[cmd.index("--out") + 1])
        volumes.add(frozenset(s for s, _ in mounts(svc) if bind_source(s) is None))
        assert str(svc["environment"]["ASTRAFLOW_METRICS_PORT"]) == "9100", name
        dep = svc["depends_on"]
        assert dep["topics"]["condition"] == "service_completed_successfully", name
    assert len(outs) == 1 and len(volumes) == 1, (outs, volumes)


def test_topics_init_creates_the_run_on_kafka_after_it_is_healthy() -> None:
    svc = services()["topics"]
    cmd = command(svc)
    assert cmd[:2] == ["topics", "create"]
    assert cmd[cmd.index("--run") + 1] == "quickstart"
    assert cmd[cmd.index("--bus") + 1] == "kafka://kafka:29092"
    assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "topics" not in svc["depends_on"]


def test_rollout_is_replicated() -> None:
    assert services()["rollout"]["deploy"]["replicas"] >= 2


def test_role_configs_load_with_their_overrides() -> None:
    """Once the example config is in the repo: it loads with each role's --set overrides, and
    its run is the one the `topics` service creates."""
    from astraflow.config import load_experiment

    run = command(services()["topics"])
    run_name = run[run.index("--run") + 1]
    paths = {name: host_path_of(svc, config_arg(command(svc)))
             for name, svc in role_services().items()}
    if not any(p.exists() for p in paths.values()):
        pytest.skip(f"{', '.join(sorted({str(p.relative_to(ROOT)) for p in paths.values()}))}"
                    " not written yet")
    for name, svc in role_services().items():
        cmd = command(svc)
        assert paths[name].is_file(), f"service {name}: no {paths[name]}"
        cfg = load_experiment(paths[name], [f"{k}={v}" for k, v in overrides(cmd).items()])
        assert cfg.run == run_name, f"service {name}: run {cfg.run}, topics creates {run_name}"


# ---------------------------------------------------------------- Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def dockerignored(path: str) -> bool:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    ignored = False
    for p in patterns:
        neg = p.startswith("!")
        p = p.lstrip("!").rstrip("/")
        parts = path.split("/")
        hit = any(fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts) + 1))
        if p.startswith("**/"):
            hit = hit or any(fnmatch.fnmatch(x, p[3:]) for x in parts)
        if hit:
            ignored = not neg
    return ignored


def test_dockerfile_installs_the_project_as_a_non_root_astraflow_entrypoint() -> None:
    ins = dockerfile()
    assert ins[0] == ("FROM", "python:3.11-slim")
    assert ("ENTRYPOINT", '["astraflow"]') in ins
    assert json.loads(dict(ins)["ENTRYPOINT"]) == ["astraflow"]
    users = [arg for op, arg in ins if op == "USER"]
    assert users and users[-1] not in ("root", "0"), users
    assert not any(op == "HEALTHCHECK" for op, _ in ins)
    assert any(op == "RUN" and "pip install" in arg for op, arg in ins)
    # what the roles run must be where compose expects it
    workdirs = [arg for op, arg in ins if op == "WORKDIR"]
    assert "/app" in workdirs
    copies = [arg.split() for op, arg in ins if op == "COPY"]
    assert ["examples", "./examples"] in copies


def test_dockerfile_copies_exist_and_are_not_dockerignored() -> None:
    for op, arg in dockerfile():
        if op != "COPY" or "--from" in arg:
            continue
        *sources, _dest = [a for a in arg.split() if not a.startswith("--")]
        for src in sources:
            if src == "examples" and not (ROOT / src).exists():
                continue  # checked by test_role_configs_load_with_their_overrides
            assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
            assert not dockerignored(src), f"COPY {src}: excluded by .dockerignore"


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    for path in (".venv", ".git", "runs", ".pytest_cache", "astraflow.egg-info",
                 "astraflow/__pycache__/x.pyc", ".astraflow"):
        assert dockerignored(path), path
    assert not dockerignored("astraflow/core/metrics.py")
    assert not dockerignored("pyproject.toml")


# ---------------------------------------------------------------- Prometheus


def scrape_hosts(job: dict[str, Any]) -> list[tuple[str, int]]:
    out = []
    for sd in job.get("dns_sd_configs", []):
        assert sd.get("type", "SRV") == "A", "compose DNS serves A records"
        out += [(n, int(sd["port"])) for n in sd["names"]]
    for sc in job.get("static_configs", []):
        for t in sc["targets"]:
            host, _, port = t.rpartition(":")
            out.append((host, int(port)))
    return out


def test_prometheus_scrapes_every_role_service_and_only_existing_ones() -> None:
    doc = prometheus()
    assert doc["global"]["scrape_interval"] == "5s"
    svcs = services()
    scraped: set[str] = set()
    for job in doc["scrape_configs"]:
        for host, port in scrape_hosts(job):
            assert host in svcs, f"job {job['job_name']}: no compose service {host!r}"
            env = svcs[host].get("environment", {})
            assert str(env.get("ASTRAFLOW_METRICS_PORT")) == str(port), \
                f"job {job['job_name']}: {host} serves metrics on " \
                f"{env.get('ASTRAFLOW_METRICS_PORT')}, scraped on {port}"
            scraped.add(host)
    missing = set(role_services()) - scraped
    assert not missing, f"role services not scraped: {missing}"


def test_replicated_services_are_found_by_dns_and_labelled_by_service() -> None:
    for job in prometheus()["scrape_configs"]:
        names = {n for sd in job.get("dns_sd_configs", []) for n in sd["names"]}
        if "rollout" not in names:
            continue
        rules = job["relabel_configs"]
        assert any(r.get("source_labels") == ["__meta_dns_name"]
                   and r.get("target_label") == "service" for r in rules)
        return
    pytest.fail("rollout is not scraped through dns_sd_configs")


# ---------------------------------------------------------------- Grafana


def grafana_mount(target: str) -> Path:
    for source, t in mounts(services()["grafana"]):
        if t == target:
            path = bind_source(source)
            assert path is not None, f"{target} is not a bind mount"
            return path
    raise AssertionError(f"grafana does not mount {target}")


def provisioning(kind: str) -> list[dict[str, Any]]:
    folder = grafana_mount(f"/etc/grafana/provisioning/{kind}")
    docs = [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.y*ml"))]
    assert docs, f"no {kind} provisioning files in {folder}"
    for d in docs:
        assert d["apiVersion"] == 1
    return docs


def test_grafana_datasource_is_the_compose_prometheus() -> None:
    sources = [s for d in provisioning("datasources") for s in d["datasources"]]
    prom = [s for s in sources if s["uid"] == "prometheus"]
    assert len(prom) == 1
    assert prom[0]["type"] == "prometheus"
    assert prom[0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in services()["prometheus"]["ports"]
    assert "3000:3000" in services()["grafana"]["ports"]


def test_grafana_provider_points_at_the_mounted_dashboards() -> None:
    providers = [p for d in provisioning("dashboards") for p in d["providers"]]
    assert providers
    for p in providers:
        assert p["type"] == "file"
        path = grafana_mount(p["options"]["path"])
        assert list(path.glob("*.json")), f"no dashboards in {path}"
    env = services()["grafana"]["environment"]
    assert str(env["GF_AUTH_ANONYMOUS_ENABLED"]).lower() == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        directory, _, file = home.rpartition("/")
        assert (grafana_mount(directory) / file).is_file(), home


def test_dashboard_schema() -> None:
    dash = dashboard()
    assert dash["uid"] == "astraflow" and dash["title"] == "AstraFlow"
    assert isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {ids}"
    cells: dict[tuple[int, int], str] = {}
    for p in panels():
        pos = p["gridPos"]
        assert {"x", "y", "w", "h"} <= set(pos), p["title"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_every_panel_queries_an_astraflow_metric_on_the_provisioned_datasource() -> None:
    uids = {s["uid"] for d in provisioning("datasources") for s in d["datasources"]}
    for p in panels():
        if p["type"] == "row":
            continue
        assert p.get("title"), p["id"]
        targets = p.get("targets", [])
        assert targets, f"panel {p['title']}: no targets"
        assert any("astraflow_" in t.get("expr", "") for t in targets), p["title"]
        assert p["datasource"]["uid"] in uids, p["title"]
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), f"panel {p['title']}: duplicate refIds"
        for t in targets:
            assert t.get("datasource", p["datasource"])["uid"] in uids, p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert t["expr"].count("{") == t["expr"].count("}"), t["expr"]


def test_dashboard_shows_what_the_brief_asks_for() -> None:
    used = {n for p in panels() for t in p.get("targets", []) for n in METRIC.findall(t["expr"])}
    for needed in ("astraflow_version", "astraflow_steps_total", "astraflow_reward_mean",
                   "astraflow_eval_accuracy", "astraflow_episodes_total", "astraflow_tokens_total",
                   "astraflow_wait_ratio", "astraflow_inflight", "astraflow_failures_total",
                   "astraflow_weight_version", "astraflow_staleness_dropped_stale_total"):
        assert needed in used, needed


POLICY_MODULES = {"assembler": "assembler", "staleness": "filters", "dynamic_sampling": "filters",
                  "gate": "gate", "greso": "greso", "replay": "replay", "batcher": "batcher"}


def test_dashboard_policy_counters_are_ones_the_policies_count() -> None:
    """A policy counter is exported as astraflow_<entry>_<key>_total from
    ``bump(state.counts, "<key>")`` in the policy's module (or a key its docstring names, for
    keys built with an f-string): the dashboard must name real keys (it once queried
    astraflow_dropped_* names no policy counts)."""
    used = {n for p in panels() for t in p.get("targets", []) for n in METRIC.findall(t["expr"])}
    checked = 0
    for name in used:
        for entry, module in POLICY_MODULES.items():
            prefix = f"astraflow_{entry}_"
            if name.startswith(prefix) and name.endswith("_total"):
                key = name[len(prefix):-len("_total")]
                source = (ROOT / "astraflow" / "policies" / f"{module}.py").read_text()
                assert f'"{key}"' in source or f"``{key}``" in source, \
                    f"{name}: {module}.py counts no {key!r}"
                checked += 1
    assert checked >= 5


def test_dashboard_counters_are_shown_as_rates() -> None:
    """A counter restarts at 0 with its process: only rate()/increase() of it means anything."""
    for p in panels():
        for t in p.get("targets", []):
            for m in METRIC.finditer(t["expr"]):
                if m.group().endswith("_total"):
                    before = t["expr"][:m.start()].rstrip()
                    assert re.search(r"\b(rate|irate|increase)\($", before), \
                        f"panel {p['title']}: {m.group()} outside rate(): {t['expr']}"


def test_every_dashboard_metric_is_documented() -> None:
    documented = documented_metrics()
    assert documented, "docs/operations.md lists no metrics"
    for p in panels():
        for t in p.get("targets", []):
            for name in METRIC.findall(t["expr"]):
                assert name in documented, \
                    f"panel {p['title']}: {name} is not listed in docs/operations.md"


def test_documented_metrics_follow_the_exporter_naming() -> None:
    """Each row of the metric table: a name the exporter can produce, `_total` exactly for
    counters (the exporter appends it to counter names)."""
    from astraflow.core.prometheus import metric_name

    rows = re.findall(r"^\|[^|]*\|\s*`(astraflow_[A-Za-z0-9_]+)`\s*\|\s*(counter|gauge)\s*\|",
                      (ROOT / "docs/operations.md").read_text(), flags=re.M)
    assert len(rows) >= 10, rows
    for name, kind in rows:
        base = name.removeprefix("astraflow_")
        assert metric_name(base) == base, name
        assert name.endswith("_total") == (kind == "counter"), f"{name} is a {kind}"
