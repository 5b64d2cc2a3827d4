"""The provisioned Grafana dashboard against a real Prometheus.

Docker does not run here, so the compose stack's Prometheus has never scraped a role. This test
starts the real ``prometheus`` server (Debian's package) with ``deploy/prometheus/local.yml``
pointed at a short real ``astraflow run`` (``launch.metrics_port_base``: every role serves its
own endpoint, listed in the run's ``prometheus-targets.json``), waits until every role is an
"up" target, then evaluates every query of every panel of
``deploy/grafana/dashboards/astraflow.json`` through Prometheus' HTTP API: each must return at
least one series, labelled with the run's name. A query that names a metric no role exports,
or that stays empty in a healthy run, fails here.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "astraflow.json"
LOCAL_CONFIG = ROOT / "deploy" / "prometheus" / "local.yml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
RUN = "promdash"
PROMETHEUS_LIFETIME_S = 300  # hard bound: `timeout` kills the server even if teardown never runs
# Grafana's built-in variables, as Grafana would substitute them on a 30-minute dashboard
BUILTINS = {"__rate_interval": "1m", "__interval": "5s", "__range": "30m", "__range_s": "1800"}


def install_hint() -> str:
    return ("the `prometheus` server is not on PATH: install it with `apt-get install -y "
            "prometheus` (scripts/test.sh does so when run as root on Debian/Ubuntu) or from "
            "https://prometheus.io/download/, or deselect this test with -m 'not slow'")


# not core.ports.free_ports: n consecutive ports (metrics_port_base + i), below the ephemeral range
def free_port_range(n: int) -> int:
    """A port p such that p .. p+n-1 are free now (the roles bind them on 0.0.0.0), below
    Linux's ephemeral range (32768-60999): a role binds its port only after its imports, and
    meanwhile any outgoing connection of a process beside it could take a port in that range
    (a CI run lost the trainer's endpoint so)."""
    for _ in range(100):
        base = random.randrange(20000, 32768 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no {n} consecutive free ports found")


def http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def stop(proc: subprocess.Popen[Any], sig: int, wait_s: float) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def astraflow_run(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A real `astraflow run` of the quickstart without its warm-up, every role serving
    metrics; stopped (SIGINT: the orchestrator stops every role) at teardown."""
    out = tmp_path / "run"
    sets = ["launch.warmup.steps=0", f"launch.metrics_port_base={free_port_range(16)}",
            "launch.timeout_s=150", "launch.stop_grace_s=10", "launch.eval_problems=20",
            "launch.eval_every=5", "trainer.metrics_interval_s=0.5", f"run={RUN}"]
    log = (tmp_path / "run.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "astraflow.cli.app", "run", str(QUICKSTART), "--out", str(out),
         "--no-live", *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        yield out, proc
    finally:
        stop(proc, signal.SIGINT, 90)
        log.close()
        # roles run in their own sessions: make sure none outlives a run that was killed
        pids = out / "processes.json"
        for pid in (json.loads(pids.read_text()).values() if pids.exists() else []):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    """The real Prometheus server on a loopback port, configured by deploy/prometheus/local.yml
    with this test's run directory and a 1 s scrape interval. Yields its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(install_hint(), pytrace=False)  # an error, not a skip: CI installs it
    config = yaml.safe_load(LOCAL_CONFIG.read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    (job,) = config["scrape_configs"]
    (sd,) = job["file_sd_configs"]
    assert all(f.endswith("/prometheus-targets.json") for f in sd["files"]), sd
    sd.update(files=[str(tmp_path / "run" / "prometheus-targets.json")], refresh_interval="1s")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port_range(1)
    log = tmp_path / "prometheus.log"
    proc = subprocess.Popen(
        ["timeout", "-s", "KILL", str(PROMETHEUS_LIFETIME_S), binary, f"--config.file={path}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=(log_file := log.open("w")), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
            assert time.monotonic() < deadline, f"prometheus not ready:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield url
    finally:
        stop(proc, signal.SIGTERM, 15)
        log_file.close()


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel, rows' panels included."""
    dash = json.loads(DASHBOARD.read_text())
    panels = [q for p in dash["panels"] for q in (p, *p.get("panels", []))]
    out = [(p["title"], t["refId"], t["expr"]) for p in panels for t in p.get("targets", [])]
    assert len(out) >= 10, out
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable syntaxes ($name, ${name}, ${name:fmt}, [[name]]) → their values."""
    def one(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        assert name in values, f"{expr}: no value for the variable {name!r} (teach this test one)"
        return values[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)", one, expr)


def variable_values() -> dict[str, str]:
    """The dashboard's own variables: `run` selects this test's run, nothing else is known."""
    names = {v["name"] for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert "run" in names, "the dashboard has no `run` variable to pick a run with"
    assert names <= {"run"}, f"unknown dashboard variables {names - {'run'}}: give them values"
    return {"run": RUN, **BUILTINS}


def query(url: str, expr: str) -> list[dict[str, Any]]:
    try:
        body = http_json(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    except urllib.error.HTTPError as e:  # 400: the expression does not parse
        raise AssertionError(f"{expr}: {e.read().decode(errors='replace')}") from e
    assert body["status"] == "success", body
    assert body["data"]["resultType"] == "vector", body
    return list(body["data"]["result"])


def await_targets_up(url: str, out: Path, run: subprocess.Popen[str], log: Path) -> set[str]:
    """Wait (bounded) until the run has written its targets and each has been scraped "up"
    (a role that finished its work, like the producer, is "down" afterwards, and rightly so)."""
    deadline = time.monotonic() + 120
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        assert run.poll() is None, f"astraflow run ended early:\n{log.read_text()[-4000:]}"
        targets_file = out / "prometheus-targets.json"
        if targets_file.exists():
            wanted = {g["labels"]["service"] for g in json.loads(targets_file.read_text())}
            ever_up = query(url, 'max by (service) (max_over_time(up{job="astraflow"}[10m]))')
            seen = {s["metric"]["service"]: float(s["value"][1]) for s in ever_up}
            if set(seen) == wanted and all(v == 1.0 for v in seen.values()):
                return wanted
        time.sleep(0.5)
    active = http_json(f"{url}/api/v1/targets?state=active")["data"]["activeTargets"]
    states = {t["labels"].get("service", "?"): f"{t['health']} {t['lastError']}" for t in active}
    raise AssertionError(f"targets never up: {seen}; now: {states}\n{log.read_text()[-4000:]}")


def test_each_role_of_a_run_gets_its_own_port_and_the_run_lists_them(tmp_path: Path) -> None:
    from astraflow.config import ExperimentConfig
    from astraflow.core.metrics import PORT_ENV
    from astraflow.run.launch import rl_roles
    from astraflow.run.supervisor import RoleSpec, Supervisor

    cfg = ExperimentConfig.model_validate({"policies": ["a", "b"],
                                           "launch": {"metrics_port_base": 20000}})
    specs = rl_roles(cfg, tmp_path / "config.yaml", tmp_path)
    assert [s.metrics_port for s in specs] == list(range(20000, 20000 + len(specs)))
    assert all(s.metrics_port is None for s in
               rl_roles(ExperimentConfig(), tmp_path / "config.yaml", tmp_path))

    # What the supervisor hands each process, and the file_sd list it writes.
    show = [sys.executable, "-c", f"import os; print(os.environ.get({PORT_ENV!r}))"]
    sup = Supervisor(tmp_path)
    sup.start([RoleSpec("a", show, metrics_port=20001), RoleSpec("b", show)])
    for r in sup.roles.values():
        assert r.proc is not None and r.proc.wait(30) == 0
    sup.stop()
    assert sup.roles["a"].tail(1) == "20001" and sup.roles["b"].tail(1) == "None"
    targets = json.loads((tmp_path / "prometheus-targets.json").read_text())
    assert targets == [{"targets": ["127.0.0.1:20001"], "labels": {"service": "a"}}]


def test_a_taken_metrics_port_is_a_warning_not_a_dead_role(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from astraflow.core import metrics
    from astraflow.core.bus import connect
    from astraflow.core.topics import run_topics

    bus = connect(f"embedded://{tmp_path}/bus.db")
    bus.create_topics(run_topics("r", ["default"]))
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        monkeypatch.setenv(metrics.PORT_ENV, str(taken.getsockname()[1]))
        monkeypatch.setattr(metrics, "_serving", False)
        with caplog.at_level("WARNING", logger="astraflow.metrics"):
            m = metrics.MetricsEmitter(bus, run="r", role="trainer")
        assert "prometheus endpoint not served" in caplog.text, caplog.text
        m.inc("steps")
        m.close()
    bus.close()


@pytest.mark.slow
def test_every_dashboard_query_returns_series_of_the_run(
        astraflow_run: tuple[Path, subprocess.Popen[str]], prometheus: str,
        tmp_path: Path) -> None:
    out, run = astraflow_run
    log = tmp_path / "run.log"
    services = await_targets_up(prometheus, out, run, log)

    # One target per role process, each on its own port.
    groups = json.loads((out / "prometheus-targets.json").read_text())
    ports = [t.rsplit(":", 1)[1] for g in groups for t in g["targets"]]
    assert len(ports) == len(set(ports)) == len(groups), groups
    roles = set(json.loads((out / "processes.json").read_text()))
    assert services == roles, (services, roles)

    values = variable_values()
    queries = [(title, ref, expr, substitute(expr, values)) for title, ref, expr in
               dashboard_queries()]
    # Counters need two scrapes inside a rate() window, the trainer a first step, the
    # evaluator a first evaluation: poll (bounded) until every query has its series.
    deadline = time.monotonic() + 120
    while True:
        problems = []
        for title, ref, expr, promql in queries:
            result = query(prometheus, promql)
            if not result:
                problems.append(f"{title} [{ref}]: no series for {expr}")
            for series in result:
                if series["metric"].get("run") != RUN:
                    problems.append(f"{title} [{ref}]: a series without run={RUN}: "
                                    f"{series['metric']} for {expr}")
        if not problems:
            break
        assert run.poll() is None, "astraflow run ended before every query had series:\n" + \
            "\n".join(problems) + f"\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "dashboard queries without series:\n" + \
            "\n".join(problems)
        time.sleep(1.0)

    # The series come from the run's own processes: every role is labelled by its run.
    by_role = query(prometheus, "count by (role, run) "
                               f'(max_over_time(astraflow_prometheus_port{{run="{RUN}"}}[10m]))')
    assert {s["metric"]["role"] for s in by_role} == {
        "producer", "rollout", "policy", "trainer", "evaluator"}, by_role

    stop(run, signal.SIGINT, 90)
    assert (out / "summary.json").exists(), (
        f"no summary.json after SIGINT (exit {run.returncode}):\n{log.read_text()[-4000:]}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_roles"] == [], summary["roles"]
