"""The CLI's habits (docs/cli.md): --version, -h everywhere, grouped help, exit codes, one
--out default, roles that refuse a run directory without a bus, and a run that never deletes
a directory unasked."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import astraflow, said
from typer.testing import CliRunner

from astraflow import __version__
from astraflow.cli.app import app
from astraflow.run import exits
from astraflow.run.orchestrate import _prepare_out

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def test_version_prints_the_package_version() -> None:
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"astraflow {__version__}"


@pytest.mark.parametrize("argv", [[], ["run"], ["rollout"], ["topics", "create"],
                                  ["weights", "serve"], ["bench", "replay"], ["broker"]])
def test_dash_h_is_help_on_every_command(argv: list[str]) -> None:
    r = CliRunner().invoke(app, [*argv, "-h"])
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.output and "-h" in r.output


def test_help_groups_the_commands_in_panels_with_one_line_each() -> None:
    r = CliRunner().invoke(app, ["-h"])
    text = said(r)
    for panel in ("Run", "Roles", "Data & weights", "Operations", "Benchmarks"):
        assert f"─ {panel} ─" in r.output, panel
    assert "run Run an experiment: every role as a process on this host." in text
    assert "Exit codes: 0 ok; 1 a run or config error; 2 a usage error; 3" in text
    from astraflow.cli.app import COMMANDS, GROUPS

    for name, *_, short in [*COMMANDS, *GROUPS]:
        assert len(short) <= 72 and "\n" not in short, name


def test_exit_codes(tmp_path: Path) -> None:
    assert CliRunner().invoke(app, ["run", str(QUICKSTART), "--no-such-flag"]).exit_code == 2
    assert CliRunner().invoke(app, ["nosuchcommand"]).exit_code == 2
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--fresh", "--resume", "--out",
                                 str(tmp_path / "x")])
    assert r.exit_code == 2 and "give one" in said(r)
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--set", "launch.rollout_workers=0",
                                 "--out", str(tmp_path / "x")])
    assert r.exit_code == 1 and "rollout_workers" in said(r)  # a config error
    assert (exits.OK, exits.ERROR, exits.USAGE, exits.ROLE_FAILED) == (0, 1, 2, 3)
    assert exits.run_code([]) == 0 and exits.run_code(["trainer-default"]) == 3


@pytest.mark.parametrize("role", [["produce"], ["rollout"], ["train"], ["evaluate"],
                                  ["policy", "batch"], ["report"], ["top"]])
def test_a_role_refuses_a_run_directory_without_a_bus(tmp_path: Path, role: list[str]) -> None:
    r = CliRunner().invoke(app, [role[0], str(QUICKSTART), *role[1:], "--out",
                                 str(tmp_path / "empty")])
    assert r.exit_code == 1, r.output
    text = said(r)
    assert "no bus in the run directory" in text and "--out DIR" in text, text
    assert not (tmp_path / "empty").exists()  # nothing made: no empty bus to wait on


def test_every_out_defaults_to_runs_slash_the_run_name(tmp_path: Path) -> None:
    r = astraflow("rollout", str(QUICKSTART), "--set", "run=habits", cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert f"no bus in the run directory runs/habits ({tmp_path}/runs/habits/bus.db" in err
    assert f"astraflow run {QUICKSTART} --out runs/habits" in err
    assert "astraflow topics create --run habits --policy default --bus embedded://" in err
    assert list(tmp_path.iterdir()) == []  # no ./bus.db, no runs/
    from astraflow.cli.common import OutOption, load_role
    from astraflow.cli.run import run

    assert run.__annotations__["out"] == "OutOption" and OutOption is not None
    # on Kafka the directory holds logs and checkpoints only: no bus file to look for
    cfg, out = load_role(QUICKSTART, ["bus.url=kafka://127.0.0.1:1", "run=k"], None)
    assert out == Path("runs/k")


def test_a_role_joins_a_run_directory_with_its_bus(tmp_path: Path) -> None:
    from astraflow.core.bus import connect

    out = tmp_path / "run"
    out.mkdir()
    connect(f"embedded://{out}/bus.db").close()
    r = CliRunner().invoke(app, ["produce", str(QUICKSTART), "--out", str(out),
                                 "--max-tasks", "3"])
    assert r.exit_code == 0, r.output
    assert "produced=3" in r.output


def test_run_never_deletes_an_existing_directory_unasked(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("run: old\n")
    (out / "metrics.jsonl").write_text("{}\n")
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--out", str(out), "--no-live"])
    text = said(r)
    assert r.exit_code == 1 and "exists: nothing was started" in text, text
    assert "--fresh" in text and "--resume" in text
    assert (out / "metrics.jsonl").exists()
    # a directory that is not a run's is refused even with --fresh
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--out", str(other), "--fresh"])
    assert r.exit_code == 1 and "is not an AstraFlow run directory" in said(r)
    assert (other / "mine.txt").read_text() == "keep"
    r = CliRunner().invoke(app, ["run", str(QUICKSTART), "--out", str(tmp_path / "new"),
                                 "--resume"])
    assert r.exit_code == 1 and "holds no run to continue" in said(r)
    # --fresh empties a run directory; --resume keeps it; an empty directory is a new run
    _prepare_out(out, fresh=False, resume=True)
    assert (out / "metrics.jsonl").exists()
    _prepare_out(out, fresh=True, resume=False)
    assert out.is_dir() and list(out.iterdir()) == []
    _prepare_out(out, fresh=False, resume=False)
