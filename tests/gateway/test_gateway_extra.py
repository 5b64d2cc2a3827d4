"""`pip install 'astraflow[gateway]'` brings everything docs/tutorials/your-agent.md uses: the
server (fastapi, uvicorn) and what an agent talks to it with (the openai SDK, httpx), pinned
as the dev extra pins them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pins(reqs: list[str]) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) for m in
            (re.fullmatch(r"([A-Za-z0-9_.-]+)(.*)", r.replace(" ", "")) for r in reqs) if m}


def test_the_gateway_extra_brings_the_sdk_the_tutorial_uses() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    gateway, dev = _pins(extras["gateway"]), _pins(extras["dev"])
    assert {"fastapi", "uvicorn", "openai", "httpx"} <= set(gateway)
    for name in ("openai", "httpx"):
        assert gateway[name] == dev[name] and "<" in gateway[name]  # one range, bounded
    tutorial = (ROOT / "docs" / "tutorials" / "your-agent.md").read_text()
    assert "import httpx" in tutorial and "import openai" in tutorial
    assert "pip install -e '.[gateway]'" in tutorial
