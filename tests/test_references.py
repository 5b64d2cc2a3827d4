"""References that lead somewhere: no tracked file cites the team's private notes (the design,
style and fact sheets they kept outside the repository, or the folder they lived in) or an
issue tracker's number; every path of the repository that a docstring, a comment, a config or a
page names (``docs/…``, ``bench/…``, ``tests/…``, …) is a file or folder of the repository,
with the heading it names when it names one; every Markdown file named bare (``README.md``) is
one of the repository's; and every module of ours that code or prose imports, runs with
``python -m`` or cites with ``:mod:``/``:func:``/``:class:`` exists. Markdown links are checked
by tests/test_docs.py, on every Markdown file of the repository."""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from test_docs import PAGES, _anchors

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".sh", ".txt"}
TEXT_NAMES = {"Dockerfile", "run"}  # and .ci/run

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
PLACEHOLDER_NEXT = set("<{*[$\\")  # docs/<page>.md, runs/{out}, bench/*.py, deploy/k8s/$X, a regex
# A Markdown file named without its folder: README.md, `architecture.md`.
BARE_MD = re.compile(r"(?<![\w./~$@-])([\w-]+\.md)\b(?![\w/-])")
# A module of ours as code and prose name one: `python -m bench.learning`, `from astraflow.core
# import x`, :func:`astraflow.models.source.resolve` (logger names such as "astraflow.rollout"
# are not modules and are not checked).
MODULE = re.compile(r"(?:python3? -m |(?<![\w.-])-m |\bfrom |^\s*import |:mod:`~?)"
                    r"((?:astraflow|bench)(?:\.\w+)+)", re.M)
NAME = re.compile(r":(?:func|class|meth|attr|data|exc):`~?((?:astraflow|bench)(?:\.\w+)+)")
# An issue tracker's number with no repository or address (owner/repo#12 and URLs are fine).
ISSUE = re.compile(r"(?<![\w/#-])issues? #?\d+\b", re.I)


def bad_references(text: str, known: Callable[[str], bool],
                   anchors: Callable[[str], set[str]] = lambda _p: set()) -> list[str]:
    """What in ``text`` leads nowhere: a name of the private notes, an issue number, a path
    that ``known`` does not know (or a heading its ``anchors`` lack), a bare Markdown name no
    known file has, or a module of ours that is not a known file or folder.

    A path is checked when it names a file (its last part has a suffix), ends with ``/``, or
    has two parts or more, except ``deploy/x`` (as often kubectl's ``deploy/NAME`` as a
    folder). Left alone: placeholders and globs (``docs/<page>.md``, ``bench/*.py``,
    ``tests/...``) and one-letter examples (``docs/x.md``, ``tests/run/a.py``, ``x.md``). A
    dotted module name is checked up to its last part that is a module: what follows may be
    anything the module defines."""
    bad = [f"{m.group(0)!r}: the team's private notes, not in the repository"
           for m in (PRIVATE.finditer(text) if any(w in text for w in PRIVATE_WORDS) else ())]
    bad += [f"{m.group(0)!r}: an issue number, and the tracker is not in the repository"
            for m in ISSUE.finditer(text)]
    for m in REPO_PATH.finditer(text):
        raw, anchor = m.group(1), m.group(2)
        if text[m.end():m.end() + 1] in PLACEHOLDER_NEXT or "..." in raw:
            continue
        path = PurePosixPath(raw.rstrip("./-"))
        if not (raw.endswith("/") or "." in path.name[1:] or len(path.parts) >= 2) or (
                path.parts[0] == "deploy" and len(path.parts) == 2 and not path.suffix):
            continue
        if len(path.stem) == 1:
            continue
        if not known(str(path)):
            bad.append(f"{m.group(0)!r}: no such file or folder in the repository")
        elif anchor and path.suffix == ".md" and anchor not in anchors(str(path)):
            bad.append(f"{m.group(0)!r}: no heading with id #{anchor} in {path}")
    bad += [f"{m.group(1)!r}: no Markdown file of that name in the repository"
            for m in BARE_MD.finditer(text)
            if len(m.group(1)) > len("x.md") and not known(f"*/{m.group(1)}")]
    bad += [f"{m.group(1)!r}: no such module in the repository"
            for m in MODULE.finditer(text) if not _module_known(m.group(1), known, strict=True)]
    bad += [f"{m.group(1)!r}: no such module in the repository"
            for m in NAME.finditer(text) if not _module_known(m.group(1), known)]
    return bad


def _module_known(dotted: str, known: Callable[[str], bool], *, strict: bool = False) -> bool:
    """Whether ``dotted`` (``bench.lib.chaos.alive``) names a module or package ``known``
    knows, followed by anything; or a package followed by a name it defines: the last part
    (``astraflow.core.records.encode``) or a class and its attribute (``...records.Batch.x``).
    ``strict`` (what ``import`` and ``python -m`` take): the whole of it is a module."""
    parts = dotted.split(".")
    folder = parts[0]
    for i, part in enumerate(parts[1:], 1):
        if known(f"{folder}/{part}.py"):
            return not strict or i == len(parts) - 1
        if not known(f"{folder}/{part}/__init__.py"):
            return not strict and i > 1 and (i == len(parts) - 1 or part[:1].isupper())
        folder = f"{folder}/{part}"
    return True


def _git_files(*flags: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", *flags], cwd=ROOT, capture_output=True,
                         check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_reference_leads_nowhere() -> None:
    """Every tracked text file. A path counts as known when git tracks it or would (a new file
    not yet added); an ignored one, made by a run or a build, does not."""
    tracked = _git_files()
    files = tracked + _git_files("--others", "--exclude-standard")
    known = (set(files) | {str(a) for p in files for a in PurePosixPath(p).parents}
             | {f"*/{PurePosixPath(p).name}" for p in files if p.endswith(".md")})
    anchors = functools.cache(lambda p: _anchors(ROOT / p))
    bad = []
    for name in tracked:
        path = ROOT / name
        if (path.suffix not in TEXT and path.name not in TEXT_NAMES) or not path.is_file() or (
                path == Path(__file__).resolve()):
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
    known_paths = {"docs", "docs/architecture.md", "docs/img", "bench", "bench/lib",
                   "bench/lib/chaos.py", "deploy"}
    anchors = {"docs/architecture.md": {"the-dataflow"}}.__getitem__

    def bad(text: str) -> list[str]:
        return bad_references(text, known, anchors)

    known = {*known_paths, "*/architecture.md", "bench/lib/__init__.py", "bench/__init__.py",
             "astraflow/__init__.py", "astraflow/core/__init__.py", "astraflow/core/ports.py",
             "tests/run"}.__contains__
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
    # two-part paths, bare Markdown names, issue numbers
    assert bad("tests/rollout") and bad("in `tests/trainer`") and not bad("tests/run and tests")
    assert bad("see CONTRIBUTING.md") and not bad("see architecture.md, or x.md")
    assert bad("reported in issue 11") and bad("(Issue #18)")
    assert not bad("pytest-dev/pytest#14964, https://github.com/a/b/issues/3, tissue 4")
    assert not bad(r"re.compile(r'scripts/quickstart\.sh')")
    # modules of ours
    assert bad("python -m bench.gone") and bad("from astraflow.gone import x")
    assert bad(":func:`astraflow.core.gone.f`") and bad("import bench.lib.nothing")
    assert bad("from astraflow.core.ports.free_port import x")
    assert not bad("python -m bench.lib.chaos, from astraflow.core.ports import free_port")
    assert not bad(":class:`~astraflow.core.Thing`, logging.getLogger('astraflow.rollout')")
