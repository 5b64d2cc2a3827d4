"""Every command in the docs is run by a test, so that the docs cannot drift from the CLI.

The fenced shell blocks (```bash) of README.md, docs/tutorials/*.md and docs/how-to/*.md are
each classified by an HTML comment on the last non-blank line before the fence (invisible on
GitHub and on the site; in a list item, leave a blank line between the two, or the site wraps
the block in a paragraph):

- ``<!-- runnable -->``: a command a reader types that runs on a machine with CPUs only; this
  module runs it.
- ``<!-- not-runnable: REASON -->``: it needs what a test machine lacks (a GPU, Docker, a
  Kafka cluster of several hosts, sudo); REASON says what.
- ``<!-- file: NAME -->`` (on a yaml or python block of a page that has runnable blocks): the
  block's text is the file NAME the page tells the reader to write, written where the reader
  is at that point.

A shell block with no marker fails :func:`test_every_shell_block_is_classified`. The
``astraflow`` commands of the blocks that do not run must still parse (the CLI knows their
commands and options), and the configs those pages build pass ``astraflow check`` for the
roles a machine here can play (:data:`FRAGMENTS`).

A page's runnable blocks run in order as one ``bash`` script under ``set -euo pipefail``, as a
reader types them into one terminal (a ``cd`` and the background jobs of one block carry over
to the next), in a fresh temporary directory: a clone of the repository (its entries linked,
``runs/`` empty) with ``$HOME`` an empty directory of its own. Long commands get short budgets
through :data:`REWRITES` (extra ``--set`` options, not edited docs), each with its reason.
Pages that train are marked ``slow``; a page whose commands are another page's runs once.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "tutorials").glob("*.md")),
         *sorted((ROOT / "docs" / "how-to").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>runnable|not-runnable|file)\s*(?::\s*(?P<arg>.*?))?"
                    r"\s*-->\s*$")
#: a command that trains or runs a suite: its page is a ``slow`` test
LONG = re.compile(r"^\s*(astraflow (run|train)\b|scripts/(quickstart|test)\.sh"
                  r"|python -m bench\.)", re.MULTILINE)
#: wall-clock limit of a page: a base, and more for each long command
PAGE_BASE_S, LONG_COMMAND_S = 90, 240
#: the checkout's entries a session's clone does not link (made fresh, or not the user's)
NOT_CLONED = {".git", ".venv", "runs", "site", ".pytest_cache", ".ruff_cache", "__pycache__"}


# --- the blocks and their markers ---------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: where it opens, its language, its text and its marker."""

    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    text: str  # dedented, without the fences
    kind: str | None  # runnable, not-runnable, file, or None (no marker)
    arg: str = ""  # the reason (not-runnable) or the file name (file)
    malformed: str = ""  # a marker-like comment that does not parse

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def shell(self) -> bool:
        return self.lang in SHELL


def _marker(lines: list[str], fence_index: int) -> tuple[str | None, str, str]:
    """(kind, arg, malformed) of the last non-blank line before a fence."""
    i = fence_index - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0:
        return None, "", ""
    m = MARKER.match(lines[i])
    if m:
        return m["kind"], (m["arg"] or "").strip(), ""
    if lines[i].strip().startswith("<!--") and ("runnable" in lines[i] or "file:" in lines[i]):
        return None, "", lines[i].strip()
    return None, "", ""


def blocks_of(text: str, page: str) -> list[Block]:
    """Every fenced block of a Markdown text, with the marker before it."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, body, j = m["fence"], [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence)
                                      and not lines[j].strip().strip(fence[0])):
            body.append(lines[j])
            j += 1
        kind, arg, malformed = _marker(lines, i)
        out.append(Block(page, i + 1, m["lang"].lower(), textwrap.dedent("\n".join(body)),
                         kind, arg, malformed))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    """The blocks of every page this module covers."""
    return [b for p in PAGES for b in blocks_of(p.read_text(), str(p.relative_to(ROOT)))]


def classification_problems(blocks: list[Block]) -> list[str]:
    """What is wrong with the markers: a shell block with none, a marker that does not parse,
    a not-runnable block with no reason, a marker on the wrong kind of block."""
    bad = []
    for b in blocks:
        first = next((x for x in b.text.splitlines() if x.strip()), "")
        if b.malformed:
            bad.append(f"{b.where}: a marker that does not parse: {b.malformed}")
        elif b.shell and b.kind is None:
            bad.append(f"{b.where}: a {b.lang} block marked neither <!-- runnable --> nor "
                       f"<!-- not-runnable: REASON -->: {first}")
        elif b.shell and b.kind == "file":
            bad.append(f"{b.where}: <!-- file: ... --> on a {b.lang} block (it marks the file "
                       "a yaml or python block is)")
        elif not b.shell and b.kind in ("runnable", "not-runnable"):
            bad.append(f"{b.where}: <!-- {b.kind} --> on a {b.lang or 'plain'} block (only "
                       "shell blocks run)")
        elif b.kind == "not-runnable" and not b.arg:
            bad.append(f"{b.where}: <!-- not-runnable: REASON --> needs its reason")
        elif b.kind == "runnable" and b.arg:
            bad.append(f"{b.where}: <!-- runnable --> takes no argument (got {b.arg!r})")
        elif b.kind == "file" and not re.fullmatch(r"[\w.-]+", b.arg):
            bad.append(f"{b.where}: <!-- file: NAME --> needs a plain file name (got {b.arg!r})")
    return bad


# --- what the test changes in a command before running it ---------------------------------


#: ``--set`` options every ``astraflow run`` gets: one trainer step, a short RL phase, one
#: rollout process, a small held-out evaluation and one pass over the tasks (the producer
#: would write them all at once, on the cores the roles start on)
RUN_BUDGET = ["trainer.max_steps=1", "launch.timeout_s=150", "launch.rollout_workers=1",
              "launch.eval_problems=8", "producer.epochs=1"]
#: and a config with an SFT warm-up: a warm-up of 2 steps that starts RL from its one check
WARMUP_BUDGET = ["launch.warmup.steps=2", "launch.warmup.check_every=2",
                 "launch.warmup.on_miss=closest"]
#: and the examples of a real model: fewer and shorter samples, a smaller held-out split
REAL_MODEL_BUDGET = {
    "smollm2_chain_sum.yaml": ["data.batch_size=2", "producer.n_samples=4",
                               "rollout.engine.max_new_tokens=8",
                               "producer.reasoning_gym.size=64", "launch.eval_samples=0",
                               "launch.eval_every=1"],
}


def run_budget(config: str) -> str:
    """The options appended to ``astraflow run CONFIG`` (:data:`RUN_BUDGET`, and
    :data:`WARMUP_BUDGET` where CONFIG has a warm-up); CONFIG is a path of the clone."""
    from astraflow.config import load_experiment

    path = ROOT / config
    if not path.is_file():
        raise AssertionError(f"a runnable `astraflow run {config}`: no such file in the "
                             "repository (the test knows the budgets of its configs only)")
    sets = list(RUN_BUDGET)
    if load_experiment(path).launch.warmup.steps > 0:
        sets += WARMUP_BUDGET
    sets += REAL_MODEL_BUDGET.get(path.name, [])
    return " --no-live " + " ".join(f"--set {s}" for s in sets)


@dataclass(frozen=True)
class Rewrite:
    """A change the test makes to a documented command line before it runs it, and why."""

    pattern: re.Pattern[str]
    replace: Callable[[re.Match[str]], str]
    why: str


def _comment(m: re.Match[str]) -> str:
    return m["comment"] or ""


REWRITES = [
    Rewrite(re.compile(r"^(?P<cmd>\s*astraflow run (?P<config>\S+)[^#\n]*?)"
                       r"(?P<comment>\s+#.*)?$"),
            lambda m: m["cmd"] + run_budget(m["config"]) + _comment(m),
            "a run of minutes: one trainer step, a short warm-up and evaluation"),
    Rewrite(re.compile(r"^(?P<cmd>\s*scripts/quickstart\.sh[^#\n]*?)(?P<comment>\s+#.*)?$"),
            lambda m: m["cmd"] + run_budget("examples/quickstart.yaml") + _comment(m),
            "its extra arguments go to `astraflow run examples/quickstart.yaml`: the budget"),
    Rewrite(re.compile(r"^(?P<cmd>\s*scripts/test\.sh)(?P<comment>\s+#.*)?$"),
            lambda m: m["cmd"] + " -q tests/test_readme_extras.py" + _comment(m),
            "the whole suite is what runs this test (CI calls the script with no argument): "
            "here the script's set-up, then one small test file through its pytest"),
    Rewrite(re.compile(r"^(?P<cmd>\s*astraflow broker start)(?![^#\n]*--port)(?P<rest>[^#\n]*?)"
                       r"(?P<comment>\s+#.*)?$"),
            lambda m: m["cmd"] + " --port 9092" + m["rest"] + _comment(m),
            "its default port said aloud, so that the page's port 9092 becomes a free one "
            "(fixed_ports) and the broker its own"),
    Rewrite(re.compile(r"^(?P<indent>\s*)pip install -e '\.\[(?P<extras>[\w,-]+)\]'"
                       r"(?P<comment>\s+#.*)?$"),
            lambda m: f"{m['indent']}af_installed {m['extras']}" + _comment(m),
            "the tests' environment is installed already, and an editable install from the "
            "temporary clone would repoint it there: the extras' packages are checked instead"),
]


def rewrite(text: str) -> str:
    """A runnable block's text with :data:`REWRITES` applied, line by line."""
    out = []
    for line in text.splitlines():
        for r in REWRITES:
            line = r.pattern.sub(r.replace, line)
        out.append(line)
    return "\n".join(out)


# not astraflow.core.ports.free_ports: `astraflow broker --port N` takes N+1 for its controller
def free_port_and_next() -> int:
    """A free port of 127.0.0.1 whose next port is free too (a broker's controller port)."""
    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def fixed_ports(texts: list[str]) -> set[str]:
    """The ports a page's commands serve on (``--port N``): each becomes a free port, since a
    fixed one may be taken on a shared machine."""
    return {p for t in texts for p in re.findall(r"--port (\d+)", t)}


def move_ports(text: str, ports: dict[str, str]) -> str:
    for old, new in ports.items():
        text = re.sub(rf"(--port |127\.0\.0\.1:|localhost:){old}\b", rf"\g<1>{new}", text)
    return text


# --- a page's commands as one script --------------------------------------------------------


PREAMBLE = r"""set -euo pipefail
af_block() { AF_BLOCK="$1"; echo "==> docs block $1"; }
trap 'echo "==> failed in docs block ${AF_BLOCK:-?} (exit $?)"' ERR
af_installed() {  # the packages of pyproject.toml's extras (comma-separated) are installed
  python - "$1" <<'AF_PY'
import re, sys, tomllib
from importlib.metadata import PackageNotFoundError, version
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
missing = []
for extra in sys.argv[1].split(","):
    if extra not in extras:
        sys.exit(f"pyproject.toml has no extra {extra!r} (it has: {', '.join(extras)})")
    for req in extras[extra]:
        name = re.match(r"[\w.-]+", req)[0]
        try:
            version(name)
        except PackageNotFoundError:
            missing.append(f"{name} (extra {extra})")
if missing:
    sys.exit("not installed: " + ", ".join(missing))
AF_PY
}
"""
#: after the last block: every background job the page left must end by itself, with exit 0
#: (or be one the page stopped with SIGTERM)
EPILOGUE = r"""af_block 'the background jobs the page left (each must end by itself)'
for af_pid in $(jobs -p); do
  af_rc=0; wait "$af_pid" || af_rc=$?
  case "$af_rc" in
    0|143) ;;  # ended, or ended by the page's own kill (SIGTERM)
    *) echo "==> a background job of the page (pid $af_pid) exited $af_rc"; exit 1 ;;
  esac
done
"""


@dataclass
class Session:
    """The runnable commands of one or more pages (pages with the same commands run once)."""

    pages: list[str]
    items: list[tuple[list[str], str, str]] = field(default_factory=list)  # where, kind, text

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple((kind, text) for _, kind, text in self.items)

    @property
    def slow(self) -> bool:
        return any(kind == "runnable" and LONG.search(text) for _, kind, text in self.items)

    @property
    def timeout(self) -> int:
        longs = sum(len(LONG.findall(text)) for _, kind, text in self.items if kind == "runnable")
        return PAGE_BASE_S + LONG_COMMAND_S * longs

    def script(self, ports: dict[str, str]) -> str:
        parts = [PREAMBLE]
        for where, kind, text in self.items:
            parts.append(f"af_block '{' and '.join(where)}'")
            text = move_ports(text, ports)
            if kind == "runnable":
                parts.append(text)
            else:
                name, body = text.split("\n", 1)
                parts.append(f"cat > {name} <<'AF_FILE'\n{body}\nAF_FILE")
        parts.append(EPILOGUE)
        return "\n".join(parts) + "\n"


def session_of(blocks: list[Block]) -> Session | None:
    """The commands a page runs (its runnable blocks rewritten, and its file blocks), or None
    when it has no runnable block."""
    if not any(b.kind == "runnable" for b in blocks):
        return None
    s = Session([blocks[0].page])
    for b in blocks:
        if b.kind == "runnable":
            s.items.append(([b.where], "runnable", rewrite(b.text)))
        elif b.kind == "file":
            s.items.append(([b.where], "file", f"{b.arg}\n{b.text}"))
    return s


def sessions() -> list[Session]:
    """One session per page with runnable blocks; pages whose commands are equal share one."""
    merged: dict[tuple, Session] = {}
    for page in PAGES:
        s = session_of(blocks_of(page.read_text(), str(page.relative_to(ROOT))))
        if s is None:
            continue
        if s.key in merged:
            first = merged[s.key]
            first.pages += s.pages
            for mine, theirs in zip(first.items, s.items, strict=True):
                mine[0].extend(theirs[0])
        else:
            merged[s.key] = s
    return list(merged.values())


# --- where a session runs -------------------------------------------------------------------


def make_clone(tmp: Path) -> Path:
    """A clone of the repository for a session: every entry of the checkout linked, except
    its run directories and caches, and a ``.venv`` that is the tests' own environment (its
    entries linked, stamped as installed for this clone, so that scripts/bootstrap.sh finds
    it ready and installs nothing)."""
    if sys.prefix == sys.base_prefix:
        pytest.fail("the docs' commands run from a virtual environment (scripts/bootstrap.sh "
                    "makes one): run the tests from one", pytrace=False)
    clone = tmp / "clone"
    clone.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_CLONED and not entry.name.endswith(".egg-info"):
            (clone / entry.name).symlink_to(entry)
    venv = clone / ".venv"
    venv.mkdir()
    for entry in Path(sys.prefix).iterdir():  # pyvenv.cfg too: `python` there is the venv's
        if entry.name != ".astraflow-installed":
            (venv / entry.name).symlink_to(entry)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    (venv / ".astraflow-installed").write_text(f"{digest} {clone}\n")
    return clone


def session_env(tmp: Path) -> dict[str, str]:
    """The environment of a session: a home of its own, the machine's caches (the imported
    models, the broker's jars, Toxiproxy), no bus or test settings from the outside."""
    home = tmp / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ASTRAFLOW_", "PYTEST_")) and k != "VIRTUAL_ENV"}
    env.update(
        HOME=str(home),
        ASTRAFLOW_CACHE=os.environ.get("ASTRAFLOW_CACHE")
        or str(Path.home() / ".cache" / "astraflow"),
        XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"),
        ASTRAFLOW_BROKER_DIR=str(tmp / "broker"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def stop_group(pgid: int) -> None:
    """End what a session left running (its own process group): SIGTERM, then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def stop_broker(tmp: Path, env: dict[str, str]) -> None:
    """Stop the broker a session's `astraflow broker start` left (it runs in a session of its
    own, outside the script's process group), where the page did not stop it itself."""
    if (tmp / "broker").exists():
        subprocess.run([sys.executable, "-m", "astraflow.cli.app", "broker", "stop"], env=env,
                       capture_output=True, timeout=60)


def log_tails(tmp: Path, lines: int = 15) -> str:
    """The last lines of every log the session's commands wrote (a background job's output
    is in its file, not in the script's)."""
    out = []
    for log in sorted(tmp.rglob("*.log")):
        if log.is_file() and not log.is_symlink():
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.relative_to(tmp)} (last {lines} lines) ---\n" + "\n".join(tail))
    return "\n".join(out)


def run_session(session: Session, tmp: Path) -> None:
    """Run a session's script in a fresh clone; fail naming the block, with the output tail."""
    clone = make_clone(tmp)
    env = session_env(tmp)
    ports = {p: str(free_port_and_next()) for p in fixed_ports([t for _, _, t in session.items])}
    script = tmp / "commands.sh"
    script.write_text(session.script(ports))
    output = tmp / "output.txt"
    started = time.monotonic()
    with output.open("w") as out:
        proc = subprocess.Popen(["bash", str(script)], cwd=clone, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=session.timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            stop_group(proc.pid)
            proc.wait()
            stop_broker(tmp, env)
    text = output.read_text(errors="replace")
    if rc == 0:
        return
    blocks = re.findall(r"^==> docs block (.*)$", text, re.MULTILINE)
    why = (f"ran past its {session.timeout} s" if rc is None else f"exited {rc}")
    pytest.fail(
        f"the commands of {', '.join(session.pages)} failed in the block at "
        f"{blocks[-1] if blocks else '?'}: {why} after {time.monotonic() - started:.0f} s\n"
        f"--- output (last 60 lines) ---\n" + "\n".join(text.splitlines()[-60:]) + "\n"
        + log_tails(tmp) + f"\n--- the script: {script} ---", pytrace=False)


# --- the tests ------------------------------------------------------------------------------


def test_every_shell_block_is_classified() -> None:
    problems = classification_problems(all_blocks())
    assert not problems, (
        "shell blocks of the docs need a marker on the line before the fence: "
        "<!-- runnable --> (tests/e2e/test_docs_commands.py runs it) or "
        "<!-- not-runnable: REASON -->:\n" + "\n".join(problems))


def test_the_classifier_catches_what_it_should() -> None:
    page = textwrap.dedent("""\
        <!-- runnable -->
        ```bash
        astraflow run examples/quickstart.yaml   # long
        ```

        ```bash
        astraflow weights serve /x
        ```
        <!-- not-runnable:   -->
        ```bash
        b
        ```
        <!-- not runnable -->
        ```sh
        c
        ```
        <!-- file: agent.yaml -->

        ```yaml
        run: x
        ```
        1. a step

            <!-- not-runnable: needs a GPU -->
            ```bash
            nvidia-smi
            ```
        <!-- runnable -->
        ```
        output
        ```
        """)
    blocks = blocks_of(page, "p.md")
    assert [(b.line, b.lang, b.kind) for b in blocks] == [
        (2, "bash", "runnable"), (6, "bash", None), (10, "bash", "not-runnable"),
        (14, "sh", None), (19, "yaml", "file"), (25, "bash", "not-runnable"),
        (29, "", "runnable")]
    assert blocks[4].arg == "agent.yaml" and blocks[5].arg == "needs a GPU"
    assert blocks[5].text == "nvidia-smi"
    problems = classification_problems(blocks)
    assert [p.split(":")[1] for p in problems] == ["6", "10", "14", "29"], problems
    assert "marked neither" in problems[0] and "needs its reason" in problems[1]
    assert "does not parse" in problems[2] and "only shell blocks run" in problems[3]


def test_the_rewrites_give_long_commands_a_budget() -> None:
    text = rewrite("astraflow run examples/quickstart.yaml --out runs/q   # ~5 min\n"
                   "scripts/quickstart.sh\nscripts/test.sh   # the suite\n"
                   "pip install -e '.[gateway]'\nastraflow check examples/quickstart.yaml")
    run, quick, suite, pip, check = text.splitlines()
    assert run.startswith("astraflow run examples/quickstart.yaml --out runs/q --no-live")
    assert run.endswith("--set launch.warmup.on_miss=closest   # ~5 min"), run
    assert "--set trainer.max_steps=1" in quick and "warmup.steps=2" in quick
    assert suite == "scripts/test.sh -q tests/test_readme_extras.py   # the suite"
    assert pip == "af_installed gateway"
    assert check == "astraflow check examples/quickstart.yaml"
    assert rewrite("astraflow broker start     # on 9092") == (
        "astraflow broker start --port 9092     # on 9092")
    assert rewrite("astraflow broker start --port 1") == "astraflow broker start --port 1"
    assert "warmup" not in rewrite("astraflow run examples/smollm2_chain_sum.yaml")
    assert move_ports("serve --port 8000 &\ncurl http://127.0.0.1:8000/h # :80001",
                      {"8000": "4242"}) == ("serve --port 4242 &\n"
                                            "curl http://127.0.0.1:4242/h # :80001")


def test_a_failing_block_is_named_with_its_output(tmp_path: Path) -> None:
    def fails(commands: str, where: Path) -> str:
        where.mkdir()
        session = Session(["p.md"], [(["p.md:3"], "runnable", "echo fine"),
                                     (["p.md:9"], "runnable", commands)])
        with pytest.raises(pytest.fail.Exception) as e:
            run_session(session, where)
        return str(e.value)

    said = fails("echo before\nls no-such-file\necho after", tmp_path / "a")
    assert "failed in the block at p.md:9: exited 2" in said, said
    assert "fine" in said and "before" in said and "no-such-file" in said
    assert "after" not in said.split("--- output")[1]
    said = fails("(sleep 0.2; exit 7) &", tmp_path / "b")
    assert "the background jobs the page left" in said and "exited 7" in said, said


def _params() -> list:
    return [pytest.param(s, id="+".join(s.pages),
                         marks=[pytest.mark.timeout(s.timeout + 60),
                                *([pytest.mark.slow] if s.slow else [])])
            for s in sessions()]


@pytest.mark.parametrize("session", _params())
def test_the_commands_of_a_page_run(session: Session, tmp_path: Path) -> None:
    """A page's runnable blocks, in order, in a fresh clone (see the module's docstring)."""
    run_session(session, tmp_path)


# --- the blocks that do not run: their commands parse -----------------------------------


SEPARATORS = {"&", "&&", ";", "|", "||"}
REDIRECT = re.compile(r"\s+\d*[<>]&?\s*[^\s&;|]+")
ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_]\w*)=(?P<q>[\"']?)(?P<value>.*)(?P=q)\s*$")


def shell_variables(blocks: list[Block]) -> dict[str, str]:
    """The variables a page's shell blocks set on a line of their own (``W="--set ..."``)."""
    found = {}
    for b in blocks:
        if b.shell:
            for line in b.text.splitlines():
                m = ASSIGNMENT.match(line.strip())
                if m:
                    found[m["name"]] = m["value"]
    return found


def expand(line: str, variables: dict[str, str]) -> str:
    """``line`` with the page's own variables expanded (others are left as they are)."""
    for _ in range(5):  # a variable may hold another (B holds $W)
        line = re.sub(r"\$\{?([A-Za-z_]\w*)\}?",
                      lambda m: variables.get(m[1], m[0]), line)
    return line


def astraflow_commands(text: str, variables: dict[str, str]) -> list[list[str]]:
    """The arguments of every ``astraflow`` command of a shell block (after ``--`` of a
    launcher such as ``python -m astraflow.core.gang N --``): continuation lines joined,
    comments, redirections and environment assignments dropped, the page's variables
    expanded."""
    import shlex

    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        lex = shlex.shlex(REDIRECT.sub(" ", expand(line, variables)), posix=True,
                          punctuation_chars=True)
        lex.whitespace_split, lex.commenters = True, "#"
        segment: list[str] = []
        for token in [*lex, ";"]:
            if token not in SEPARATORS:
                segment.append(token)
                continue
            while segment and (ASSIGNMENT.match(segment[0]) or segment[0] in ("do", "then")):
                segment.pop(0)
            if "--" in segment and segment[:1] == ["python"]:
                segment = segment[segment.index("--") + 1:]
            if segment[:1] == ["astraflow"]:
                commands.append(segment[1:])
            segment = []
    return commands


def cli_problem(args: list[str]) -> str | None:
    """Why the CLI refuses ``astraflow ARGS`` (an unknown command or option, a missing
    argument), or None; nothing is run."""
    import typer

    from astraflow.cli.app import app

    command = typer.main.get_command(app)
    name, parent = "astraflow", None
    try:
        while True:
            ctx = command.make_context(name, list(args), parent=parent)
            if not hasattr(command, "resolve_command"):  # a command, not a group
                return None
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            name, sub, args = command.resolve_command(ctx, rest)
            if sub is None:
                return f"no command {name!r}"
            command, parent = sub, ctx
    except typer.TyperException as e:  # the CLI's usage errors (click's, as typer ships it)
        return e.format_message() if hasattr(e, "format_message") else str(e)


def test_the_commands_that_do_not_run_parse() -> None:
    """Each ``astraflow`` command of a block that cannot run here names commands and options
    the CLI has, with the arguments they need."""
    bad, seen = [], 0
    for page in PAGES:
        blocks = blocks_of(page.read_text(), str(page.relative_to(ROOT)))
        variables = shell_variables(blocks)
        for b in blocks:
            if b.kind != "not-runnable":
                continue
            for args in astraflow_commands(b.text, variables):
                seen += 1
                problem = cli_problem(args)
                if problem:
                    bad.append(f"{b.where}: astraflow {' '.join(args)}: {problem}")
    assert seen >= 10, f"only {seen} commands found: the extraction lost them"
    assert not bad, "commands the CLI refuses:\n" + "\n".join(bad)


def test_the_commands_of_a_block_are_found() -> None:
    text = textwrap.dedent("""\
        X=1 astraflow serve a.yaml --port 1 > serve.log 2>&1 &   # the gateway
        python -m astraflow.core.gang 4 -- \\
            astraflow train $B --policy default &
        for gpu in 0 1; do
          CUDA_VISIBLE_DEVICES=$gpu astraflow rollout c.yaml --worker-id "$(hostname)-gpu$gpu" &
        done
        sudo install -d /etc/x && astraflow top c.yaml
        """)
    assert astraflow_commands(text, {"B": "b.yaml --out /r $W", "W": "--set k=v"}) == [
        ["serve", "a.yaml", "--port", "1"], ["train", "b.yaml", "--out", "/r", "--set", "k=v",
                                             "--policy", "default"],
        ["rollout", "c.yaml", "--worker-id", "$(hostname)-gpu$gpu"], ["top", "c.yaml"]]
    assert cli_problem(["top", "c.yaml"]) is None
    assert "No such option" in cli_problem(["weights", "serve", "/x", "--hots", "h"])
    assert "Missing argument" in cli_problem(["train"])
    assert cli_problem(["nonsense"]) is not None


# --- the blocks that do not run: their configs pass `astraflow check` -----------------------


@dataclass(frozen=True)
class Fragment:
    """A yaml block of a page, merged over an example as the page says, and the roles the
    merged config is checked for (the hosts the page runs it on cannot be had here)."""

    page: str
    needle: str  # a line of the block that finds it
    base: str  # the example the page starts from
    roles: tuple[str, ...]
    stand_in: bool = False  # the model: a tiny one saved here, for a hub id that is not here


FRAGMENTS = [
    # deploy.md's config for several hosts and its sharded trainer, over the GPU recipe: the
    # trainer host without its data (a GSM8K download), a tiny model for the recipe's hub id
    Fragment("docs/how-to/deploy.md", "run: gsm8k-prod", "examples/gsm8k_gpu.yaml",
             ("train", "policy"), stand_in=True),
    Fragment("docs/how-to/deploy.md", "parallel: fsdp", "examples/gsm8k_gpu.yaml",
             ("train", "policy"), stand_in=True),
    # far-workers.md's region: a rollout worker reading from a mirror with a fallback
    Fragment("docs/how-to/far-workers.md", "fallback:", "examples/quickstart.yaml",
             ("rollout",)),
]


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _fragment(f: Fragment) -> dict:
    found = [b for b in blocks_of((ROOT / f.page).read_text(), f.page)
             if b.lang == "yaml" and any(x.strip().startswith(f.needle)
                                         for x in b.text.splitlines())]
    assert len(found) == 1, f"{f.page}: {len(found)} yaml blocks with a line {f.needle!r}"
    return yaml.safe_load(found[0].text)


@pytest.mark.parametrize("fragment", FRAGMENTS, ids=lambda f: f"{f.page}:{f.needle}")
def test_the_config_of_a_page_that_does_not_run_passes_check(
        fragment: Fragment, tmp_path: Path, ascii_dir: Path) -> None:
    config = _merge(yaml.safe_load((ROOT / fragment.base).read_text()), _fragment(fragment))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = [a for r in fragment.roles for a in ("--role", r)]
    if fragment.stand_in:
        args += ["--set", f"models.default.path={ascii_dir}"]
    proc = subprocess.run([sys.executable, "-m", "astraflow.cli.app", "check", str(path),
                           "--no-weights", "--out", str(tmp_path / "run"), *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, (f"{fragment.page}'s block with {fragment.needle!r} over "
                                  f"{fragment.base}:\n{proc.stdout}{proc.stderr}")
