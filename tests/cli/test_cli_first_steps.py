"""What a newcomer's first commands do: error text printed as it is, never read as
rich markup; reading commands that never create a bus; a weight server and a mirror that
start where the docs say; a run that suggests only what it accepts; `models import` without a
DEST; and a reward module in the user's own directory found without PYTHONPATH."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import said
from typer.testing import CliRunner

from astraflow.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
#: the console script a user types (``python -m`` would put the working directory on
#: sys.path by itself, and hide what item 8 is about)
ASTRAFLOW = Path(sys.executable).with_name("astraflow")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the variables that would point a command elsewhere."""
    drop = ("ASTRAFLOW_BUS", "PYTHONPATH", "ASTRAFLOW_WEIGHTS_TOKEN")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


# -- 1. error text in square brackets ---------------------------------------------------------


def test_error_and_warning_text_in_square_brackets_is_printed_as_it_is(capsys) -> None:
    from astraflow.cli.common import fail, warn

    assert fail("policies [a, b] in [gateway]: see [bold]x[/]").exit_code == 1
    warn("section [gateway] is empty")
    err = " ".join(capsys.readouterr().err.split())
    assert "error: policies [a, b] in [gateway]: see [bold]x[/]" in err, err
    assert "warning: section [gateway] is empty" in err, err


def test_an_error_escaping_a_command_keeps_its_square_brackets(monkeypatch, capsys) -> None:
    import astraflow.cli.app as cli_app
    from astraflow.core.errors import AstraflowError

    def broken() -> None:
        raise AstraflowError("unknown policy [gateway] in [a, b]")

    monkeypatch.setattr(cli_app, "app", broken)
    with pytest.raises(SystemExit) as e:
        cli_app.main()
    assert e.value.code == 1
    assert "error: unknown policy [gateway] in [a, b]" in capsys.readouterr().err


def test_check_prints_keys_and_findings_with_square_brackets(monkeypatch, tmp_path,
                                                             capsys) -> None:
    import astraflow.run.check as run_check
    from astraflow.cli.check import run_check as print_check
    from astraflow.config import load_experiment

    def check(*_args, **_kwargs) -> run_check.CheckReport:
        report = run_check.CheckReport()
        report.bad("data.post_rollout[1]", "expected one of [gateway, replay]")
        return report

    monkeypatch.setattr(run_check, "check_experiment", check)
    assert not print_check(load_experiment(QUICKSTART), tmp_path).ok
    err = " ".join(capsys.readouterr().err.split())
    assert "problem data.post_rollout[1]: expected one of [gateway, replay]" in err, err


# -- 3. reading a run never creates its bus ---------------------------------------------------


@pytest.mark.parametrize("argv", [["inspect", "af.r.tasks"], ["topics", "list"],
                                  ["topics", "describe", "af.r.tasks"]])
def test_reading_commands_refuse_a_bus_that_does_not_exist(tmp_path: Path, monkeypatch,
                                                           argv: list[str]) -> None:
    monkeypatch.delenv("ASTRAFLOW_BUS", raising=False)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, argv)
    text = said(r)
    assert r.exit_code == 1, text
    assert "no bus at .astraflow/bus.db (the default --bus)" in text, text
    assert "--out DIR" in text and "--bus URL" in text
    r = CliRunner().invoke(app, [*argv, "--out", "runs/r"])
    assert r.exit_code == 1 and f"no bus at {tmp_path}/runs/r/bus.db (--out runs/r)" in said(r)
    r = CliRunner().invoke(app, [*argv, "--bus", f"embedded://{tmp_path}/x/bus.db"])
    assert r.exit_code == 1 and f"no bus at {tmp_path}/x/bus.db" in said(r)
    assert list(tmp_path.iterdir()) == []  # nothing made: no .astraflow/, no runs/


def test_topics_create_makes_the_bus_that_the_readers_then_read(tmp_path: Path,
                                                                monkeypatch) -> None:
    monkeypatch.delenv("ASTRAFLOW_BUS", raising=False)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["topics", "create", "--run", "r", "--out", "runs/r"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "runs" / "r" / "bus.db").exists()
    r = CliRunner().invoke(app, ["topics", "list", "--out", "runs/r"])
    assert r.exit_code == 0 and "af.r.tasks\t32" in r.output, r.output
    r = CliRunner().invoke(app, ["inspect", "af.r.tasks", "--out", "runs/r"])
    assert r.exit_code == 0 and r.output == "", r.output
    r = CliRunner().invoke(app, ["topics", "create", "t1"])  # the default bus: made here
    assert r.exit_code == 0 and (tmp_path / ".astraflow" / "bus.db").exists(), r.output


# -- 4, 5. the weight server and the mirror ---------------------------------------------------


def test_weights_serve_creates_a_store_that_does_not_exist_yet(tmp_path: Path) -> None:
    store = tmp_path / "new" / "store"
    child = subprocess.Popen([str(ASTRAFLOW), "weights", "serve", str(store), "--port", "0"],
                             cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "the server printed nothing in 60 s"
        line = child.stdout.readline()
    finally:
        child.terminate()
        _, err = child.communicate(timeout=30)
    assert f"serving {store} at http://" in line and "created empty" in line, (line, err)
    assert store.is_dir() and list(store.iterdir()) == []
    (tmp_path / "file").write_text("x")
    r = CliRunner().invoke(app, ["weights", "serve", str(tmp_path / "file"), "--port", "0"])
    assert r.exit_code == 2 and "is a file" in said(r), said(r)


def test_weights_mirror_reads_the_run_directory_of_every_command(tmp_path: Path,
                                                                 monkeypatch) -> None:
    from astraflow.cli.common import OutOption
    from astraflow.cli.weights import mirror

    assert mirror.__annotations__["out"] == "OutOption" and OutOption is not None
    monkeypatch.delenv("ASTRAFLOW_BUS", raising=False)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["weights", "mirror", str(tmp_path), "--serve", "m",
                                 "--config", str(QUICKSTART)])
    text = said(r)
    assert r.exit_code == 1, text
    assert f"no bus in the run directory runs/quickstart ({tmp_path}/runs/quickstart/bus.db" \
           in text, text
    assert list(tmp_path.iterdir()) == []  # no ./bus.db, no mirror directory


# -- 6. `run` on a directory that is not a run's ----------------------------------------------


def test_run_on_a_directory_that_is_not_a_run_suggests_only_another_out(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("keep")
    for flags in ([], ["--fresh"], ["--resume"]):
        r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--out", str(notes), *flags])
        text = said(r)
        assert r.exit_code == 1, text
        assert "is not an AstraFlow run directory" in text and "give another --out" in text
        assert "Give --fresh" not in text, text  # nothing suggested that would be refused
    assert (notes / "mine.txt").read_text() == "keep"


# -- 7. `models import` without DEST ----------------------------------------------------------


def test_models_import_without_dest_goes_where_the_config_path_resolves(
        tmp_path: Path, monkeypatch) -> None:
    from astraflow.models.source import SHORTCUTS, SOURCE_FILE, resolve, shortcut_dir

    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path / "cache"))
    folder = shortcut_dir(SHORTCUTS["smollm2-135m-instruct"])
    folder.mkdir(parents=True)  # imported before: found, not imported again
    (folder / "config.json").write_text("{}")
    (folder / SOURCE_FILE).write_text(json.dumps({"parameters": 134_515_008}))
    assert resolve("smollm2-135m-instruct") == folder
    r = CliRunner().invoke(app, ["models", "import", "smollm2-135m-instruct"])
    assert r.exit_code == 0, r.output
    assert f"smollm2-135m-instruct is in {folder}, 134.5M parameters" in said(r), said(r)
    assert "set models.<policy>.path to smollm2-135m-instruct" in said(r)
    r = CliRunner().invoke(app, ["models", "import", str(tmp_path / "missing")])
    assert r.exit_code == 1 and "no default DEST: give one" in said(r), said(r)


# -- 8. a reward module in the user's own directory -------------------------------------------

REWARD = "def score(completion, reference, **kwargs):\n    return 1.0\n"
CONFIG = """run: mine
policies: [default]
models:
  default: {build: tiny-arith, seed: 0}
producer: {source: arithmetic}
rollout:
  reward: {name: "my_reward:score"}
  workflow: {modules: [my_flow]}
"""


@pytest.mark.parametrize("where", ["cwd", "config"])
def test_check_finds_a_reward_module_in_the_users_own_directory(tmp_path: Path,
                                                                where: str) -> None:
    work, conf = tmp_path / "work", tmp_path / "conf"
    work.mkdir()
    conf.mkdir()
    (work if where == "cwd" else conf).joinpath("my_reward.py").write_text(REWARD)
    (work / "my_flow.py").write_text("LOADED = True\n")
    (conf / "exp.yaml").write_text(CONFIG)
    r = subprocess.run([str(ASTRAFLOW), "check", "../conf/exp.yaml", "--no-weights"],
                       cwd=work, env=clean_env(), capture_output=True, text=True, timeout=120)
    err = " ".join(r.stderr.split())
    assert r.returncode == 0, err
    assert "ok rollout.reward: 'my_reward:score' scores" in err, err
    (work / "my_flow.py").unlink()  # a module that is nowhere: still a problem, named
    r = subprocess.run([str(ASTRAFLOW), "check", "../conf/exp.yaml", "--no-weights"],
                       cwd=work, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "cannot import 'my_flow'" in " ".join(r.stderr.split())


def test_every_role_run_starts_finds_the_users_modules(tmp_path: Path, monkeypatch) -> None:
    """The roles of `astraflow run` read the config copied into the run directory and may run
    elsewhere: the directories reach them through $PYTHONPATH in their environment."""
    from astraflow.cli.common import find_user_code
    from astraflow.core.launcher import role_env

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "my_reward.py").write_text(REWARD)
    monkeypatch.chdir(tmp_path)
    find_user_code(conf / "exp.yaml")
    env = role_env()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(conf), "/elsewhere"]
    find_user_code(conf / "exp.yaml")  # once each, however often a config is loaded
    assert os.environ["PYTHONPATH"] == env["PYTHONPATH"]
    role = subprocess.run([sys.executable, "-c", "import my_reward; print(my_reward.score("
                           "'', None))"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert role.returncode == 0 and role.stdout.strip() == "1.0", role.stderr
