"""The README names every extra pyproject.toml defines, and the license it names is the one in
LICENSE and in the package metadata."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_names_every_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    sentence = re.search(r"^Extras: (.+?)\n\n", readme, re.MULTILINE | re.DOTALL)
    assert sentence, "the README's install section lists the extras in an 'Extras: ...' paragraph"
    # an extra is a name in code followed by what it is for, or by "and" and the next one
    named = {a or b for a, b in re.findall(r"`([a-z0-9_-]+)`\s+\(|`([a-z0-9_-]+)`\s+and\s",
                                           sentence[1])}
    assert named == set(extras), f"README extras {sorted(named)} != pyproject {sorted(extras)}"


def test_the_license_is_apache_2_everywhere() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert "License: [Apache-2.0](LICENSE)" in (ROOT / "README.md").read_text()
