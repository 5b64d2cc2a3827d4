"""The actuators against real processes: a recording shell script for ``command`` (counts,
placeholders, retries with backoff, timeouts, count_command), real child processes and real
signals for ``local`` (up, down newest-first, SIGKILL after the grace period, crashes,
close)."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_for

from astraflow.consumers.scaler.actuators import (
    Actuation,
    CommandActuator,
    LocalActuator,
    build_actuator,
)
from astraflow.consumers.scaler.command import backoff_delays, render, template_fields
from astraflow.consumers.scaler.config import ActuatorConfig
from astraflow.core.errors import ConfigError

# ---------------------------------------------------------------- command: a recording script


@pytest.fixture
def script(tmp_path: Path) -> Callable[..., tuple[Path, Path]]:
    """``script(fail_until=0, out="")``: a shell script that appends its arguments to
    ``calls.txt``; its first ``fail_until - 1`` calls print to stderr and exit 1 (the call
    count lives in a state file); it prints ``out`` on success. Returns (script, calls)."""

    def make(fail_until: int = 0, out: str = "", name: str = "act") -> tuple[Path, Path]:
        calls, state = tmp_path / f"{name}-calls.txt", tmp_path / f"{name}-state"
        path = tmp_path / f"{name}.sh"
        path.write_text(
            "#!/bin/sh\n"
            f'echo "$*" >> "{calls}"\n'
            f'n=$(cat "{state}" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "{state}"\n'
            f'if [ "$n" -lt {fail_until} ]; then echo "cluster says no ($n)" >&2; exit 1; fi\n'
            f"printf '%s' '{out}'\n")
        path.chmod(0o755)
        return path, calls

    return make


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_command_is_called_with_the_counts_and_placeholders(script) -> None:
    sh, calls = script()
    sleeps: list[float] = []
    act = CommandActuator(f"{sh} --replicas={{target}} --from={{current}} {{pool}} {{run}}",
                          run="demo-run", pool="rollout", sleep=sleeps.append)
    assert act.count() is None  # no count_command: the scaler uses the report's count
    first = act.scale(5, 2)
    second = act.scale(3, 5)
    assert lines(calls) == ["--replicas=5 --from=2 rollout demo-run",
                            "--replicas=3 --from=5 rollout demo-run"]
    assert first == Actuation(True, 5, 2, 1, "", first.duration_s)
    assert second.ok and (second.target, second.previous, second.attempts) == (3, 5, 1)
    assert sleeps == []
    act.close()


def test_pool_with_a_space_reaches_the_command_as_one_argument(script, tmp_path) -> None:
    sh, _ = script()
    argv = tmp_path / "argv.txt"
    act = CommandActuator(f"for a in {{pool}} {{target}}; do echo \"$a\" >> {argv}; done",
                          run="r", pool="my pool; rm -rf x")
    assert act.scale(2, 1).ok
    assert lines(argv) == ["my pool; rm -rf x", "2"]


def test_braces_that_are_not_placeholders_are_left_alone() -> None:
    assert template_fields("kubectl get d/x -o jsonpath={.spec.replicas} ${HOME} {{end}}") == []
    assert render("jsonpath={.spec.replicas} ${HOME} {{end}} n={target}", {"target": 4}) == \
        "jsonpath={.spec.replicas} ${HOME} {end} n=4"


def test_unknown_placeholder_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError) as e:
        CommandActuator("kubectl scale deploy/x --replicas={replicas}", run="r", pool="p")
    msg = str(e.value)
    assert "{replicas}" in msg and "{target}, {current}, {pool}, {run}" in msg
    # count_command runs before any target is known: only {pool} and {run}
    with pytest.raises(ConfigError, match=r"count_command.*\{target\}.*valid: \{pool\}, \{run\}"):
        CommandActuator("echo {target}", run="r", pool="p", count_command="echo {target}")
    # through the factory, the problem names the pool's config path
    with pytest.raises(ConfigError, match=r"scale\.pools\.gpu\.actuator\.command.*\{n\}"):
        build_actuator(ActuatorConfig(type="command", command="echo {n}"), run="r", pool="gpu")


def test_a_failing_command_is_retried_with_doubling_backoff(script) -> None:
    sh, calls = script(fail_until=3)  # exit 1, exit 1, then success
    sleeps: list[float] = []
    act = CommandActuator(f"{sh} {{target}}", run="r", pool="p", retries=4, backoff_s=0.5,
                          sleep=sleeps.append)
    out = act.scale(4, 2)
    assert out.ok and out.attempts == 3
    assert sleeps == [0.5, 1.0]
    assert out.error == "exit 1: cluster says no (2)"  # the last failure, kept for the log
    assert lines(calls) == ["4", "4", "4"]


def test_a_command_that_always_fails_gives_up_without_raising(script, caplog) -> None:
    sh, calls = script(fail_until=10**6)
    sleeps: list[float] = []
    act = CommandActuator(f"{sh} {{target}}", run="r", pool="p", retries=3, backoff_s=2.0,
                          sleep=sleeps.append)
    with caplog.at_level(logging.WARNING, logger="astraflow.scaler"):
        out = act.scale(7, 3)
    assert not out.ok
    assert (out.target, out.previous, out.attempts) == (7, 3, 4)
    assert out.error == "exit 1: cluster says no (4)"
    assert sleeps == [2.0, 4.0, 8.0]
    assert len(lines(calls)) == 4
    gave_up = [r for r in caplog.records if "gave up" in r.getMessage()]
    assert len(gave_up) == 1 and gave_up[0].levelno == logging.ERROR
    assert "attempts=4" in gave_up[0].getMessage() and "pool=p" in gave_up[0].getMessage()


def test_backoff_is_capped_at_a_minute() -> None:
    assert backoff_delays(4, 20.0) == [20.0, 40.0, 60.0, 60.0]
    assert backoff_delays(0, 1.0) == []
    sleeps: list[float] = []
    act = CommandActuator("exit 3", run="r", pool="p", retries=3, backoff_s=40.0,
                          sleep=sleeps.append)
    assert act.scale(1, 0).error == "exit 3"
    assert sleeps == [40.0, 60.0, 60.0]


def test_a_command_that_hangs_is_killed_at_its_timeout(tmp_path) -> None:
    marker = tmp_path / "finished"
    # the shell's child (sleep) holds the output pipes: the whole process group must go
    act = CommandActuator(f"echo starting >&2; sleep 60; touch {marker}", run="r", pool="p",
                          timeout_s=0.5, retries=1, backoff_s=0.0, sleep=lambda s: None)
    out = act.scale(2, 1)
    assert not out.ok and out.attempts == 2
    assert out.error == "timed out after 0.5s: starting"
    assert out.duration_s < 30  # not the 2 x 60 s of the sleeps: they were killed
    assert not marker.exists()


def test_a_shell_that_cannot_run_the_command_is_an_error_too(tmp_path) -> None:
    act = CommandActuator(f"{tmp_path}/no-such-tool --replicas={{target}}", run="r", pool="p",
                          retries=0)
    out = act.scale(2, 1)
    assert not out.ok and out.attempts == 1
    assert out.error.startswith("exit 127") and "no-such-tool" in out.error


def test_count_command_parses_an_integer(script) -> None:
    sh, calls = script(out="3\n", name="count")
    act = CommandActuator("true", run="demo", pool="gpu",
                          count_command=f"{sh} {{pool}} {{run}} jsonpath={{.spec.replicas}}")
    assert act.count() == 3
    assert lines(calls) == ["gpu demo jsonpath={.spec.replicas}"]


@pytest.mark.parametrize(("output", "fail_until"), [("three", 0), ("", 0), ("-1", 0), ("4", 2)])
def test_count_command_bad_output_or_failure_is_unknown(script, caplog, output,
                                                        fail_until) -> None:
    sh, _ = script(out=output, fail_until=fail_until, name="count")
    act = CommandActuator("true", run="r", pool="p", count_command=str(sh))
    with caplog.at_level(logging.WARNING, logger="astraflow.scaler"):
        assert act.count() is None
    assert [r for r in caplog.records if "count_command" in r.getMessage()
            and r.levelno == logging.WARNING]


def test_factory_builds_by_type(tmp_path) -> None:
    cfg = ActuatorConfig(type="command", command="echo {target}", count_command="echo 2",
                         timeout_s=5, retries=1, backoff_s=0.25)
    act = build_actuator(cfg, run="demo", pool="rollout")
    assert isinstance(act, CommandActuator)
    assert (act.timeout_s, act.retries, act.backoff_s, act.run, act.pool) == \
        (5, 1, 0.25, "demo", "rollout")
    assert act.count() == 2
    local = build_actuator(ActuatorConfig(rollout_args=["--set", "rollout.engine.threads=2"]),
                           run="demo", pool="rollout", config_path="exp.yaml",
                           out=str(tmp_path))
    assert isinstance(local, LocalActuator)
    assert local.argv(0) == [sys.executable, "-m", "astraflow.cli.app", "rollout", "exp.yaml",
                             "--out", str(tmp_path), "--set", "rollout.engine.threads=2"]
    with pytest.raises(ConfigError, match="config's path"):
        build_actuator(ActuatorConfig(type="local"), run="demo", pool="rollout")


def test_default_argv_names_real_rollout_options() -> None:
    """The local actuator's command line is one `astraflow rollout` accepts."""
    import typer.main

    from astraflow.cli.app import app

    cmd = typer.main.get_command(app).commands["rollout"]  # type: ignore[attr-defined]
    opts = {o for p in cmd.params for o in p.opts}
    assert "--out" in opts and "--set" in opts


# ---------------------------------------------------------------- local: real processes

CHILD = r"""
import os, signal, sys, time
d, n, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def term(*_):
    open(os.path.join(d, f"term-{n}"), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else term)
print(f"child {n} up", flush=True)
# written whole, then renamed: the test sees the file only once the pid is in it
with open(os.path.join(d, f".started-{n}"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(d, f".started-{n}"), os.path.join(d, f"started-{n}"))
if mode == "crash":
    sys.exit(3)
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def local_factory(tmp_path: Path):
    made: list[LocalActuator] = []

    def make(modes: dict[int, str] | None = None, grace_s: float = 20.0) -> LocalActuator:
        modes = modes or {}
        act = LocalActuator(
            argv=lambda n: [sys.executable, "-c", CHILD, str(tmp_path), str(n),
                            modes.get(n, "drain")],
            out=tmp_path / "run", grace_s=grace_s)
        made.append(act)
        return act

    yield make
    for act in made:
        act.close()


def started(d: Path, *ns: int) -> Callable[[], bool]:
    return lambda: all((d / f"started-{n}").exists() for n in ns)


def test_local_scales_up_to_n_with_a_log_each(local_factory, tmp_path) -> None:
    act = local_factory()
    assert act.count() == 0
    out = act.scale(3, 0)
    assert out.ok and (out.target, out.previous, out.attempts, out.error) == (3, 0, 1, "")
    assert act.count() == 3
    wait_for(started(tmp_path, 0, 1, 2), 15, what="three children")
    pids = {int((tmp_path / f"started-{n}").read_text()) for n in range(3)}
    assert pids == set(act.pids())
    for n in range(3):
        log = tmp_path / "run" / "logs" / f"scaled-rollout-{n}.log"
        wait_for(lambda log=log, n=n: f"child {n} up" in log.read_text(), 15, what=f"log {n}")
    # already at the target: nothing to do
    same = act.scale(3, 3)
    assert same == Actuation(True, 3, 3, 0, "", same.duration_s)


def test_local_scale_down_terms_the_newest_and_reaps_them(local_factory, tmp_path) -> None:
    act = local_factory()
    act.scale(3, 0)
    wait_for(started(tmp_path, 0, 1, 2), 15, what="three children")
    oldest = act.pids()[0]
    out = act.scale(1, 3)
    assert out.ok and (out.previous, out.target) == (3, 1)
    assert act.count() == 1  # the stopping ones are not counted, at once
    assert act.pids() == [oldest]
    wait_for(lambda: act.stopping() == 0, 15, what="the two newest reaped")
    assert (tmp_path / "term-1").exists() and (tmp_path / "term-2").exists()
    assert not (tmp_path / "term-0").exists()
    assert act.exit_codes == {1: 0, 2: 0}  # drained and exited 0
    # scaling up again starts new processes (new numbers, new logs)
    act.scale(2, 1)
    wait_for(started(tmp_path, 3), 15, what="child 3")
    assert act.count() == 2 and (tmp_path / "run" / "logs" / "scaled-rollout-3.log").exists()


def test_local_kills_a_process_that_ignores_sigterm_after_the_grace(local_factory,
                                                                      tmp_path) -> None:
    act = local_factory({0: "ignore"}, grace_s=0.5)
    act.scale(1, 0)
    wait_for(started(tmp_path, 0), 15, what="child 0")
    out = act.scale(0, 1)
    assert out.ok and act.count() == 0
    wait_for(lambda: 0 in act.exit_codes, 15, what="child 0 killed")
    assert act.exit_codes[0] == -signal.SIGKILL
    assert not (tmp_path / "term-0").exists()
    assert act.stopping() == 0


def test_local_drops_a_crashed_process_from_the_count(local_factory, tmp_path, caplog) -> None:
    act = local_factory({1: "crash"})
    with caplog.at_level(logging.WARNING, logger="astraflow.scaler"):
        act.scale(3, 0)
        wait_for(started(tmp_path, 0, 1, 2), 15, what="three children")
        wait_for(lambda: act.count() == 2, 15, what="the crash noticed")
    assert act.exit_codes == {1: 3}
    assert any("exited" in r.getMessage() and "exit=3" in r.getMessage()
               for r in caplog.records)
    # the scaler asks for 3 again: one new process replaces it
    assert act.scale(3, 2).previous == 2
    assert act.count() == 3


def test_local_close_stops_everything(local_factory, tmp_path) -> None:
    act = local_factory({2: "ignore"}, grace_s=0.5)
    act.scale(3, 0)
    wait_for(started(tmp_path, 0, 1, 2), 15, what="three children")
    act.close()
    assert act.count() == 0 and act.stopping() == 0
    assert act.exit_codes == {0: 0, 1: 0, 2: -signal.SIGKILL}
    assert (tmp_path / "term-0").exists() and (tmp_path / "term-1").exists()
    act.close()  # idempotent


def test_local_reports_a_process_that_cannot_start(tmp_path) -> None:
    act = LocalActuator(argv=lambda n: [str(tmp_path / "no-such-binary")], out=tmp_path)
    out = act.scale(2, 0)
    assert not out.ok and out.previous == 0 and out.attempts == 1
    assert "no-such-binary" in out.error
    assert act.count() == 0
    act.close()
