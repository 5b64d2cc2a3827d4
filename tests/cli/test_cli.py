"""The CLI driven as a user drives it: real processes, the embedded bus, outputs checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from cli_helpers import astraflow
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.core.bus import connect
from astraflow.core.records import ChatMessage, Task, encode, schema_header


def test_topics_create_list_describe_and_inspect(tmp_path: Path) -> None:
    url = f"embedded://{tmp_path}/bus.db"
    r = astraflow("topics", "create", "--run", "r1", "--policy", "solver", "--bus", url,
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "af.r1.tasks\t32" in r.stdout and "af.r1.batches.solver\t1" in r.stdout
    bus = connect(url)
    p = bus.producer()
    t = Task(id="t1", dataset="d", prompt=[ChatMessage(role="user", content="1+2=")],
             reference={"answer": 3})
    p.produce("af.r1.tasks", encode(t), key=b"t1", headers=[schema_header(t)])
    p.produce("af.r1.tasks", b"\xc1garbage", key=b"bad")
    p.flush()
    bus.close()

    r = astraflow("topics", "list", "--bus", url, cwd=tmp_path)
    assert "af.r1.weights.solver\t1" in r.stdout
    r = astraflow("topics", "describe", "af.r1.tasks", "--bus", url, cwd=tmp_path)
    assert r.returncode == 0 and "32 partitions" in r.stdout

    r = astraflow("inspect", "af.r1.tasks", "--bus", url, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 2
    good = next(x for x in lines if x["key"] == "t1")
    assert good["record"]["schema"] == "Task" and good["record"]["reference"] == {"answer": 3}
    assert good["headers"] == {"af-schema": "Task/1"}
    bad = next(x for x in lines if x["key"] == "bad")
    assert "not a msgpack record" in bad["error"] and bad["raw_base64"]
    # --from and --limit
    where = {x["key"]: x["origin"] for x in lines}
    part, off = re.match(r"af\.r1\.tasks\[(\d+)\]@(\d+)", where["t1"]).groups()
    r = astraflow("inspect", "af.r1.tasks", "--from", f"{part}:{int(off) + 1}", "--bus", url,
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "t1" not in [json.loads(x)["key"] for x in r.stdout.splitlines()]
    r = astraflow("inspect", "af.r1.tasks", "--limit", "1", "--bus", url, cwd=tmp_path)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1
    r = astraflow("inspect", "af.r1.tasks", "--from", "latest", "--bus", url, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == ""
    r = astraflow("inspect", "af.r1.tasks", "--from", "sideways", "--bus", url, cwd=tmp_path)
    assert r.returncode != 0 and "--from" in r.stderr and "Traceback" not in r.stderr


def test_unknown_topic_is_a_one_line_error(tmp_path: Path) -> None:
    connect(f"embedded://{tmp_path}/bus.db").close()  # a bus without that topic
    r = astraflow("inspect", "nope", "--bus", f"embedded://{tmp_path}/bus.db", cwd=tmp_path)
    assert r.returncode == 1
    assert "error:" in r.stderr and "nope" in r.stderr and "Traceback" not in r.stderr


def test_bad_bus_url_names_the_valid_forms(tmp_path: Path) -> None:
    r = astraflow("topics", "list", "--bus", "redis://x", cwd=tmp_path)
    assert r.returncode == 1 and "embedded:///path/to/bus.db" in r.stderr


@pytest.mark.slow
def test_demo_kills_a_worker_and_loses_nothing(tmp_path: Path) -> None:
    r = astraflow("demo", "--tasks", "240", "--out", str(tmp_path / "demo"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"(\d+)/240 tasks answered .* lost (\d+)", r.stdout.replace("\n", " "))
    assert m and m.group(1) == "240" and m.group(2) == "0", r.stdout[-2000:]
    assert "killed (SIGKILL)" in r.stdout
    assert "'worker-0': -9" in r.stdout.replace("\n", "")


def test_astraflow_bus_reaches_every_config_command(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """ASTRAFLOW_BUS works for the experiment commands too (they take the bus from the config):
    it overrides bus.url, and an explicit --set bus.url still wins."""
    url = f"embedded://{tmp_path}/from-env.db"
    monkeypatch.setenv("ASTRAFLOW_BUS", url)
    r = CliRunner().invoke(app, ["config", "show"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.output)["bus"]["url"] == url
    r = CliRunner().invoke(app, ["config", "show", "--set", "bus.url=kafka://h:9092"])
    assert yaml.safe_load(r.output)["bus"]["url"] == "kafka://h:9092"
    from astraflow.cli.common import load_config

    assert load_config(None, []).bus.url == url
