"""References that lead somewhere: no tracked file cites the team's private notes (the design,
style and fact sheets they kept outside the repository, or the folder they lived in), and
every path of the repository that a docstring, a comment, a config or a page names
(``docs/…``, ``bench/…``, ``tests/…``, …) is a file or folder of the repository, with the heading
it names when it names one. Markdown links are checked by tests/test_docs.py, on every
Markdown file of the repository."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from test_docs import PAGES, _anchors

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".sh", ".txt"}

# Spelled so that this file does not match itself.
PRIVATE = re.compile(
    r"\b(?:DESIGN|STYLE|KAFKA)[.]md\b|\bQUICKSTART[-]FACTS\b|\bDESIGN[ ]§"
    r"|(?<![\w./-])(?:[.][.]/)+shared\b|(?<![\w./-])shared[/]")
PRIVATE_WORDS = ("DESIGN", "STYLE", "KAFKA", "QUICKSTART", "shared")  # a quick test first

# A path from the repository root, as prose and code name one: `docs/weights.md#stores`,
# bench/lib/, ./scripts/test.sh. Not after a word, a slash or a dot (a URL, /abs/docs/x, a.docs/).
REPO_PATH = re.compile(
    r"(?<![\w./~$@-])(?:\./)?((?:astraflow|bench|deploy|docs|examples|scripts|tests)/[\w./-]*)"
    r"(?:#([\w-]+))?")
PLACEHOLDER_NEXT = set("<{*[$")  # docs/<page>.md, runs/{out}, bench/*.py, deploy/k8s/$X


def bad_references(text: str, known: Callable[[str], bool],
                   anchors: Callable[[str], set[str]] = lambda _p: set()) -> list[str]:
    """What in ``text`` leads nowhere: a name of the private notes, or a path that ``known``
    does not know (or a heading its ``anchors`` lack).

    A path is checked when it names a file (its last part has a suffix), ends with ``/``, or
    has three parts or more; ``deploy/x`` is as often kubectl's ``deploy/NAME`` or a module as a
    folder. Left alone: placeholders and globs (``docs/<page>.md``, ``bench/*.py``, ``tests/...``)
    and one-letter examples (``docs/x.md``, ``tests/run/a.py``)."""
    bad = [f"{m.group(0)!r}: the team's private notes, not in the repository"
           for m in (PRIVATE.finditer(text) if any(w in text for w in PRIVATE_WORDS) else ())]
    for m in REPO_PATH.finditer(text):
        raw, anchor = m.group(1), m.group(2)
        if text[m.end():m.end() + 1] in PLACEHOLDER_NEXT or "..." in raw:
            continue
        path = PurePosixPath(raw.rstrip("./-"))
        if not (raw.endswith("/") or "." in path.name[1:] or len(path.parts) >= 3):
            continue
        if len(path.stem) == 1:
            continue
        if not known(str(path)):
            bad.append(f"{m.group(0)!r}: no such file or folder in the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(str(path)):
            bad.append(f"{m.group(0)!r}: no heading with id #{anchor} in {path}")
    return bad


def _git_files(*flags: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *flags], cwd=ROOT, capture_output=True,
                         check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_reference_leads_nowhere() -> None:
    """Every tracked text file. A path counts as known when git tracks it or would (a new file
    not yet added); an ignored one, made by a run or a build, does not."""
    tracked = _git_files()
    files = tracked + _git_files("--others", "--exclude-standard")
    known = set(files) | {str(a) for p in files for a in PurePosixPath(p).parents}
    anchors = functools.cache(lambda p: _anchors(ROOT / p))
    bad = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in TEXT or not path.is_file() or path == Path(__file__).resolve():
            continue  # this file plants bad references in its own test
        text = path.read_text(errors="replace")
        if not bad_references(text, known.__contains__, anchors):
            continue
        for i, line in enumerate(text.splitlines(), 1):  # where
            bad += [f"{name}:{i}: {b}" for b in
                    bad_references(line, known.__contains__, anchors)]
    assert not bad, "references that lead nowhere:\n" + "\n".join(bad)


def test_every_markdown_file_has_its_links_checked() -> None:
    checked = {str(p.relative_to(ROOT)) for p in PAGES}
    unchecked = [f for f in _git_files() if f.endswith(".md") and f not in checked]
    assert not unchecked, f"add them to tests/test_docs.py's PAGES: {unchecked}"


def test_the_scanner_catches_what_it_should() -> None:
    known = {"docs", "docs/architecture.md", "docs/img", "bench", "bench/lib",
             "bench/lib/chaos.py", "deploy"}.__contains__
    anchors = {"docs/architecture.md": {"the-dataflow"}}.__getitem__

    def bad(text: str) -> list[str]:
        return bad_references(text, known, anchors)

    notes = "DESIGN"
    assert bad(f"the bus ({notes}.md §4)") and bad(f"({notes} §9)")
    assert bad("STYLE" + ".md") and bad("see QUICKSTART" + "-FACTS.md") and bad("KAFKA" + ".md")
    assert bad("[notes](../" + "shared/x.md)") and bad("../../" + "shared") and bad("shared" + "/")
    assert bad("see docs/archtecture.md.") and bad("(`docs/architecture.md#the-dataflw`)")
    assert bad("python ./bench/lib/chaoss.py") and bad("bench/lib/nothing/") \
        and bad("# docs/img/nothing.png")
    assert not bad("see docs/architecture.md. and `docs/architecture.md#the-dataflow`")
    assert not bad("bench/lib/ and bench/lib/chaos.py, https://x.org/docs/y.md, a/docs/z.md")
    assert not bad("docs/<page>.md, bench/*.py, docs/{name}.md, tests/..., docs/x.md, "
                   "kubectl scale deploy/astraflow-rollout, shared.db, a_shared/b")
