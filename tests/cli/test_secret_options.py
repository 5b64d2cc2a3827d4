"""Tokens of commands come from a file or the environment, never needed on a command line
(where `ps` shows them): `astraflow weights serve` started the way the docs show, then a real
request with and without the token; and no page of the docs puts a token on a command line."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from astraflow.cli.app import app
from astraflow.core.errors import WeightStoreError
from astraflow.weights.http import HttpStore
from astraflow.weights.store import FileStore

DOCS = Path(__file__).resolve().parents[2] / "docs"
TOKEN = "file-t0ken-5f2a"
BLOB = bytes(range(256)) * 4
ENV_VARS = ("ASTRAFLOW_WEIGHTS_TOKEN", "ASTRAFLOW_WEIGHTS_UPSTREAM_TOKEN")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    FileStore(tmp_path / "store", fsync=False).put("p/blob.afw", BLOB)
    return tmp_path / "store"


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    f = tmp_path / "weights.token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


@pytest.fixture
def serve(tmp_path: Path, store_dir: Path) -> Iterator:
    """Start `astraflow weights serve STORE --port 0 ARGS` (env: ENV added); returns its URL
    and, once stopped, its stderr."""
    children: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> tuple[str, subprocess.Popen]:
        base = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
        child = subprocess.Popen(
            [sys.executable, "-m", "astraflow.cli.app", "weights", "serve", str(store_dir),
             "--port", "0", *args], cwd=tmp_path, env={**base, **(env or {})},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        children.append(child)
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "the server printed nothing in 60 s"
        line = child.stdout.readline()
        url = re.search(r"at (http://\S+)", line)
        assert url and "(token required)" in line, (line, child.poll())
        return url[1], child

    yield start
    for child in children:
        child.terminate()
        child.communicate(timeout=30)


def _stop(child: subprocess.Popen[str]) -> str:
    child.terminate()
    return child.communicate(timeout=30)[1]


def test_weights_serve_takes_its_token_from_a_file_or_the_environment(
        serve, token_file: Path) -> None:
    for url, child in (serve("--token-file", str(token_file)),
                       serve(env={"ASTRAFLOW_WEIGHTS_TOKEN": TOKEN})):
        assert HttpStore(url, token=TOKEN).read("p/blob.afw") == BLOB
        for wrong in (None, TOKEN + "x", "nope"):
            with pytest.raises(WeightStoreError, match="401|token"):
                HttpStore(url, token=wrong).read("p/blob.afw")
        err = _stop(child)
        assert "warning" not in err and TOKEN not in err


def test_a_token_on_the_command_line_still_works_and_is_warned_about(serve) -> None:
    url, child = serve("--token", TOKEN)
    assert HttpStore(url, token=TOKEN).read("p/blob.afw") == BLOB
    err = _stop(child)
    assert "visible to every user" in err and "--token-file" in err


@pytest.mark.parametrize(("content", "expect"), [
    ("", "found 0 non-empty lines"),
    ("a\nb\n", "found 2 non-empty lines"),
])
def test_a_bad_token_file_is_refused_before_serving(tmp_path: Path, store_dir: Path,
                                                    content: str, expect: str) -> None:
    f = tmp_path / "tok"
    f.write_text(content)
    f.chmod(0o600)
    r = CliRunner().invoke(app, ["weights", "serve", str(store_dir), "--port", "0",
                                 "--token-file", str(f)])
    assert r.exit_code == 1 and expect in r.output, r.output
    r = CliRunner().invoke(app, ["weights", "serve", str(store_dir), "--port", "0",
                                 "--token-file", str(f), "--token", "x"])
    assert r.exit_code == 1 and "not both" in r.output, r.output


def test_a_token_file_others_can_read_is_warned_about(token_file: Path, capsys) -> None:
    from astraflow.cli.common import read_secret_file

    assert read_secret_file(token_file, "--token-file") == TOKEN
    assert "warning" not in capsys.readouterr().err
    token_file.chmod(0o644)
    assert read_secret_file(token_file, "--token-file") == TOKEN
    assert "can be read by other users" in capsys.readouterr().err


def test_every_token_option_of_the_cli_has_a_file_option_beside_it() -> None:
    import typer.main

    def commands(group, prefix=()):
        for name, cmd in getattr(group, "commands", {}).items():
            yield (*prefix, name), cmd
            yield from commands(cmd, (*prefix, name))

    seen = []
    for path, cmd in commands(typer.main.get_command(app)):
        flags = {f for p in cmd.params for f in getattr(p, "opts", [])}
        for flag in flags:
            if re.fullmatch(r"--([a-z]+-)*(token|password|secret|api-key)", flag):
                seen.append((" ".join(path), flag))
                assert f"{flag}-file" in flags, (path, flag)
    assert ("weights serve", "--token") in seen and ("weights mirror", "--upstream-token") in seen


def test_no_page_of_the_docs_puts_a_token_on_a_command_line() -> None:
    pages = [p for p in DOCS.rglob("*.md") if p.name != "cli.md"]  # cli.md: the generated list
    assert any(p.name == "deploy.md" for p in pages)
    found = [f"{p.relative_to(DOCS)}:{n}: {line.strip()}" for p in pages
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"--(upstream-)?token[ =]", line)]
    assert not found, "\n".join(found)
    deploy = (DOCS / "how-to" / "deploy.md").read_text()
    assert "weights serve" in deploy and "--token-file" in deploy


def test_the_cli_logs_no_secret(tmp_path: Path) -> None:
    """A command's log handlers (set up by the app's callback, as in every role `astraflow
    run` starts) hide secrets in each line."""
    script = ("import logging\n"
              "from astraflow.cli.app import _root\n"
              "_root(version=False, log_level='INFO')\n"
              f"logging.getLogger('astraflow.x').info('upstream said 401 to token=%s', "
              f"{TOKEN!r})\n"
              "logging.getLogger('astraflow.x').info('max_tokens=64 done')\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "upstream said 401 to token=***" in r.stderr and TOKEN not in r.stderr
    assert "max_tokens=64 done" in r.stderr
