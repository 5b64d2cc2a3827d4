"""Each package's front page (its ``__init__`` docstring) lists exactly its modules and
subpackages under "Modules:", one line each: a module added, renamed or removed without its
line fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "astraflow"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
LISTED = re.compile(r"^- :mod:`\.([A-Za-z_][A-Za-z0-9_]*)`", re.M)


def contents(pkg: Path) -> set[str]:
    return ({p.stem for p in pkg.glob("*.py") if p.name != "__init__.py"}
            | {d.name for d in pkg.iterdir() if (d / "__init__.py").is_file()})


def listed(pkg: Path) -> set[str]:
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    _, found, block = doc.partition("\nModules:\n")
    return set(LISTED.findall(block)) if found else set()


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_the_front_page_lists_exactly_the_packages_modules(pkg: Path) -> None:
    have = contents(pkg)
    if not have:
        return
    said = listed(pkg)
    assert said == have, (f"{pkg / '__init__.py'}: not listed: {sorted(have - said)}; "
                          f"listed but absent: {sorted(said - have)}")
