"""The README and the documentation site: the site builds with no warning, every relative link
and anchor resolves, the generated CLI reference matches the app, and the README stays the
short front door it is meant to be. Paths named in prose and code, and the team's private notes
named anywhere, are checked by tests/test_references.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.cli.reference import cli_reference_markdown, github_slug

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links there are not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def _anchors(page: Path) -> set[str]:
    """The heading ids of a Markdown page, as GitHub (and the site's slugify) make them."""
    seen: dict[str, int] = {}
    ids = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not m:
            continue
        slug = github_slug(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def _links(page: Path) -> list[str]:
    return LINK.findall(_prose(page.read_text()))


def test_every_relative_link_and_anchor_resolves() -> None:
    bad = []
    for page in PAGES:
        for target in _links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.is_relative_to(ROOT):
                bad.append(f"{where} points outside the repository")
            elif dest.relative_to(ROOT).parts[:1] == ("shared",):
                bad.append(f"{where} points into the team's notes folder, not the docs")
            elif not dest.exists():
                bad.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{where}: no heading with id #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_link_check_catches_what_it_should(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A `code` title: here\n\n[a](#a-code-title-here) [b](q.md#x) "
                    "`[not](y.md)`\n```\n[nor](z.md)\n```\n")
    assert _links(page) == ["#a-code-title-here", "q.md#x"]
    assert _anchors(page) == {"a-code-title-here"}


def test_generated_cli_reference_is_current() -> None:
    doc = (DOCS / "reference" / "cli.md").read_text()
    assert doc == cli_reference_markdown(), (
        "docs/reference/cli.md is stale: run "
        "`python -m astraflow.cli.reference > docs/reference/cli.md`")


def test_cli_reference_covers_every_visible_command() -> None:
    import typer

    from astraflow.cli.app import app

    root = typer.main.get_command(app)
    doc = (DOCS / "reference" / "cli.md").read_text()

    def walk(cmd: object, path: str) -> None:
        assert f"`{path}`" in doc, path
        if hasattr(cmd, "list_commands"):
            ctx = cmd.context_class(cmd)  # type: ignore[attr-defined]
            for name in cmd.list_commands(ctx):  # type: ignore[attr-defined]
                sub = cmd.get_command(ctx, name)  # type: ignore[attr-defined]
                if not sub.hidden:
                    walk(sub, f"{path} {name}")

    walk(root, "astraflow")
    assert "demo-worker" not in doc  # hidden commands stay out


def test_architecture_page_names_every_package() -> None:
    page = (DOCS / "architecture.md").read_text()
    packages = sorted(p.name for p in (ROOT / "astraflow").iterdir()
                      if (p / "__init__.py").exists())
    missing = [p for p in packages if f"`astraflow.{p}`" not in page]
    assert not missing, f"docs/architecture.md does not say what these packages hold: {missing}"


def test_readme_is_a_short_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    # the two commands: the main job and the whole test suite (.ci/run calls the second)
    assert "scripts/quickstart.sh" in text and "scripts/test.sh" in text
    for guide in ("docs/tutorials/your-model.md", "docs/tutorials/several-models.md",
                  "docs/tutorials/your-agent.md", "docs/how-to/deploy.md"):
        assert f"]({guide})" in text, f"the README's next paths must link {guide}"


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail("mkdocs-material is missing: pip install -e '.[docs]' (also in [dev])")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").exists()
