"""Who may import whom: the import-linter contracts in pyproject.toml hold
(docs/architecture.md#the-roles-and-their-rooms).

Roles (producers, rollout, trainer, policies) never import one another nor the code that
composes them (``astraflow.config``, ``run/``, ``cli/``), core imports no other package of
ours, and only core talks to Kafka or SQLite. Imports inside functions count.
"""

from __future__ import annotations

import importlib.util
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import astraflow

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> list[dict]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return doc["tool"]["importlinter"]["contracts"]


def test_import_contracts_are_kept() -> None:
    if importlib.util.find_spec("importlinter") is None:
        pytest.fail("import-linter is not installed: pip install -e '.[dev]'")
    # run from the checkout, so the package analysed is this one; no cache written into it
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())", "--no-cache", "--no-logo"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"import contracts broken (lint-imports):\n{report}"
    n = len(_contracts())
    assert f"{n} kept, 0 broken" in report, report


def test_the_kafka_and_sqlite_contract_covers_every_package_but_core() -> None:
    """A new top-level package must be named in the contract, or it could import
    confluent_kafka unchecked."""
    (contract,) = [c for c in _contracts()
                   if set(c.get("forbidden_modules", ())) == {"confluent_kafka", "sqlite3"}]
    packages = {f"astraflow.{m.name}" for m in pkgutil.iter_modules(astraflow.__path__)}
    assert set(contract["source_modules"]) == packages - {"astraflow.core"}


def test_no_contract_carries_an_exception() -> None:
    """The layers hold without ``ignore_imports``: the gateway is a one-way client of rollout
    (docs/architecture.md#the-roles-and-their-rooms), and no other arrow runs back up."""
    assert [c["name"] for c in _contracts() if c.get("ignore_imports")] == []


def test_no_role_imports_the_gateway() -> None:
    (contract,) = [c for c in _contracts() if c["name"] == "no role depends on the gateway"]
    assert "astraflow.consumers" in contract["source_modules"]
    assert contract["forbidden_modules"] == ["astraflow.gateway"]
