"""Files users run without us: compose.yaml must stay valid, the CLI must start fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_compose_file_runs_a_single_node_kraft_kafka() -> None:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    kafka = doc["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:4.")
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "9092:9092" in kafka["ports"]
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR"):
        assert env[key] == 1, key
    # every listener named in the map is declared, and the advertised one is reachable locally
    names = {part.split(":")[0] for part in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")}
    assert {x.split(":")[0] for x in env["KAFKA_LISTENERS"].split(",")} == names
    assert "PLAINTEXT://127.0.0.1:9092" in env["KAFKA_ADVERTISED_LISTENERS"]


def test_help_does_not_import_heavy_modules() -> None:
    code = ("import sys; from astraflow.cli.app import app; "
            "heavy = [m for m in ('torch', 'transformers', 'confluent_kafka', 'numpy', 'sqlite3')"
            " if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ci_runs_the_readme_test_command() -> None:
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "scripts/test.sh" in (ROOT / "README.md").read_text()
