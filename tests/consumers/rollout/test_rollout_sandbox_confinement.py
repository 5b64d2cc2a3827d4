"""The code sandbox keeps the run to itself (docs/rollout.md): the code never runs as the
worker's own uid unless the config accepts it (``rollout.sandbox.allow_same_uid``, warned), it sees neither
the run directory nor the worker's working directory nor home directories, and all it writes
shares one quota (a size-limited tmpfs in its mount namespace), never the host's disk.

Each test runs the real mechanism (namespaces, pivot_root, setuid to ``nobody``); where this
host lacks one, the test skips and says which."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import astraflow
from astraflow.consumers.rollout.rewards import sandbox
from astraflow.consumers.rollout.rewards.sandbox import (
    SandboxLimits,
    isolation,
    run_python,
)

LIMITS = SandboxLimits(timeout_s=20.0)
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the sandbox's isolation is Linux-only")
NOBODY = 65534


def _need_namespaces() -> None:
    iso = isolation()
    if not iso.namespaces:
        pytest.skip(f"no mount namespace for sandboxes on this host: {iso.missing()}")


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run directory where runs may live, outside /tmp (hidden before this issue as well):
    a world-readable config.yaml holding a token (as item 7 found them) and a 0600
    checkpoint."""
    parent = next((p for p in ("/srv", "/opt", "/var") if os.access(p, os.W_OK)), None)
    made = Path(parent) / f"af-run-{uuid.uuid4().hex}" if parent else tmp_path / "run"
    made.mkdir()
    made.chmod(0o755)
    (made / "config.yaml").write_text("gateway:\n  token: af-token-" + uuid.uuid4().hex)
    (made / "config.yaml").chmod(0o644)
    (made / "model.safetensors").write_bytes(b"weights")
    (made / "model.safetensors").chmod(0o600)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


_PEEK = """
import json, os, sys
out = {}
for path in sys.argv[1:] or PATHS:
    try:
        with open(path, 'rb') as f:
            out[path] = f.read().decode(errors='replace')
    except OSError as e:
        out[path] = e.errno
print(json.dumps({'files': out, 'root': sorted(os.listdir('/')), 'uid': os.getuid()}))
"""


def test_the_run_directory_the_cwd_and_home_are_not_visible(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker started in its run directory (as ``astraflow run`` leaves it) runs code that
    tries to read the run's config, its checkpoint and a file in the worker's home."""
    _need_namespaces()
    monkeypatch.chdir(run_dir)
    home = Path.home() / f".af-secret-{uuid.uuid4().hex}"
    try:
        home.write_text("home secret")
    except OSError as e:
        pytest.skip(f"cannot plant a file in the worker's home {Path.home()}: {e}")
    home.chmod(0o644)
    paths = [str(run_dir / "config.yaml"), str(run_dir / "model.safetensors"), str(home),
             "config.yaml", f"/proc/{os.getpid()}/cwd/config.yaml",
             f"/proc/{os.getppid()}/root{run_dir}/config.yaml"]
    try:
        res = run_python(_PEEK.replace("PATHS", repr(paths)), limits=LIMITS)
    finally:
        home.unlink()
    assert res.ok, res.stderr
    got = json.loads(res.stdout)
    assert got["files"] == {p: errno.ENOENT for p in paths}, got["files"]
    iso = isolation()
    allowed = {"dev", "proc", "tmp", "var"} | {Path(p).parts[1] for p in
                                               (*iso.system, *iso.reach)}
    assert set(got["root"]) <= allowed, got["root"]


def test_the_work_folder_has_a_total_disk_quota_off_the_hosts_disk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MB files (well under the per-file cap) into the work folder, /tmp and /dev/shm: the
    writes stop at the quota they share, and none of it reaches the host's work directory."""
    _need_namespaces()
    left_on_host: list[list[str]] = []
    rmtree = shutil.rmtree

    def recorded(path: str | Path, *args: object, **kwargs: object) -> None:
        if Path(path).name.startswith("af-sandbox-") and not Path(path).name.startswith(
                "af-sandbox-probe"):
            left_on_host.append(sorted(os.listdir(path)))
        rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox.shutil, "rmtree", recorded)
    code = """
import errno, os
written, err = 0, None
chunk = b'x' * (1 << 20)
try:
    for i in range(40):
        folder = ('.', '/tmp', '/dev/shm')[i % 3]
        with open(f'{folder}/fill-{i}', 'wb') as f:
            f.write(chunk)
        written += 1
except OSError as e:
    err = e.errno
st = os.statvfs('.')
print(written, err, st.f_blocks * st.f_frsize)
"""
    res = run_python(code, limits=replace(LIMITS, disk_mb=8))
    assert res.ok, res.stderr
    written, err, size = res.stdout.split()
    assert err == str(errno.ENOSPC), res.stdout  # stopped by the quota, not by 40 files
    assert 4 <= int(written) <= 8, res.stdout
    assert int(size) == 8 << 20, res.stdout  # the work folder is the quota'd file system
    assert left_on_host == [[".stderr", ".stdout", "main.py"]]  # nothing it wrote


def test_a_root_worker_runs_code_as_a_uid_of_its_own() -> None:
    if os.geteuid() != 0:
        pytest.skip("the worker is not root here")
    if not isolation().own_uid:
        pytest.skip(f"this host cannot give sandboxes a uid of their own: {sandbox.missing()}")
    res = run_python("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n",
                     limits=LIMITS)
    assert res.ok, res.stderr
    uid, gid, groups = res.stdout.split(maxsplit=2)
    assert int(uid) not in (0, os.getuid()) and int(gid) != 0 and groups.strip() == "[]"


def test_the_same_uid_fallback_is_refused_unless_the_worker_config_allows_it(
        tmp_path: Path, arith_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A root worker whose interpreter cannot run as another user (the uid-0 fallback, the
    worker's own uid): by default its code reward fails (counted, never a silent 0);
    ``rollout.sandbox.allow_same_uid: true`` runs it, with one warning."""
    import msgspec
    from rollout_helpers import make_task, produce

    from astraflow.config import ExperimentConfig
    from astraflow.run.resources import open_bus
    from astraflow.run.roles import configured_worker

    iso = isolation()
    if not (iso.root and iso.namespaces):
        pytest.skip("the uid-0 fallback is that of a root worker with namespaces")
    monkeypatch.setitem(sandbox._isolation, sys.executable, replace(iso, own_uid=False))
    monkeypatch.setattr(sandbox, "POLICY", sandbox.SandboxPolicy())

    def failures(allow: bool | None) -> int:
        rollout: dict = {"engine": {"model": str(arith_dir), "threads": 1, "max_new_tokens": 2},
                         "reward": {"name": "code", "kwargs": {"timeout_s": 20}},
                         "weights": {"enabled": False}, "commit_interval": 0.05,
                         "poll_timeout": 0.05, "metrics_interval": 0.2}
        if allow is not None:
            rollout["sandbox"] = {"allow_same_uid": allow}
        out = tmp_path / f"run-{allow}"
        cfg = ExperimentConfig.model_validate({
            "run": f"r{uuid.uuid4().hex[:8]}",
            "bus": {"url": f"embedded://{out}/bus.db", "partitions": {"tasks": 1}},
            "rollout": rollout})
        task = msgspec.structs.replace(make_task(0, n=1), reference={"tests": "assert True"})
        bus = open_bus(cfg, out)
        try:
            produce(bus, cfg.run, [task])
            stats = configured_worker(cfg, out, bus=bus, worker_id="w-1").run(max_tasks=1)
        finally:
            bus.close()
        assert stats.tasks_done == 1
        return stats.reward_failures

    with caplog.at_level("WARNING", logger="astraflow"):
        assert failures(None) == 1  # the default refuses
        assert any("allow_same_uid" in r.getMessage() and "SandboxError" in r.getMessage()
                   for r in caplog.records)
        assert failures(False) == 1
        caplog.clear()
        assert failures(True) == 0
    same = [r for r in caplog.records if "own uid" in r.getMessage()]
    assert len(same) == 1, [r.getMessage() for r in caplog.records]


# --- a worker that is not root ---------------------------------------------------------------
_WORKER = """
import json, logging, sys
sys.path.insert(0, SRC)
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from astraflow.consumers.rollout.rewards import sandbox as sb
out = {"namespaces": sb.isolation().namespaces}
try:
    sb.run_python("print('ran')")
    out["default"] = "ran"
except sb.SandboxError as e:
    out["default"] = str(e)
sb.configure(allow_same_uid=True)
res = sb.run_python(sys.stdin.read(), limits=sb.SandboxLimits(timeout_s=20.0))
out["allowed"] = [res.returncode, res.stdout, res.stderr, list(res.unisolated)]
print(json.dumps(out))
"""


def _nobody_src() -> Path:
    """A folder ``nobody`` can import astraflow from: the checkout, or (where a folder above
    it is closed to others, as a ``mktemp -d`` clone is) a world-readable copy of the
    package."""
    src = Path(astraflow.__file__).parent.parent
    if all(os.stat(d).st_mode & 0o001 for d in (src, *src.parents)):
        return src
    import atexit
    import tempfile

    copy = Path(tempfile.mkdtemp(prefix="af-nobody-src-", dir="/tmp"))
    atexit.register(shutil.rmtree, copy, True)
    copy.chmod(0o755)
    shutil.copytree(src / "astraflow", copy / "astraflow",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for d in (copy, *copy.rglob("*")):
        d.chmod(0o755 if d.is_dir() else 0o644)
    return copy


def _as_nobody(python: str, code: str, cwd: Path, src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-I", "-c", _WORKER.replace("SRC", repr(str(src)))], input=code, cwd=cwd,
        capture_output=True, text=True, timeout=120, check=False, user=NOBODY, group=NOBODY,
        extra_groups=[], env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8"})


def test_a_worker_that_is_not_root_refuses_unless_allowed_and_still_hides_the_run(
        run_dir: Path) -> None:
    """The worker runs as ``nobody`` (setuid/setgid by the test) in its own run directory,
    whose checkpoint only it may read. By default the code is refused (it would run as
    ``nobody`` itself); allowed, it runs as ``nobody`` but cannot see the run directory."""
    if os.geteuid() != 0:
        pytest.skip("the test becomes nobody with setuid, which needs root")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that nobody may run")
    src = _nobody_src()
    check = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 10))"],
                           capture_output=True, text=True, check=False)
    if check.stdout.strip() != "True":
        pytest.skip(f"{python} is older than Python 3.10")
    for p in (run_dir, *run_dir.iterdir()):
        os.chown(p, NOBODY, NOBODY)
    run_dir.chmod(0o700)
    secret = run_dir / "model.safetensors"
    code = _PEEK.replace("PATHS", repr([str(secret), str(run_dir / "config.yaml"),
                                        "model.safetensors"]))
    res = _as_nobody(python, code, run_dir, src)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert "refusing to run untrusted code as the worker's own uid" in got["default"], got
    assert "rollout.sandbox.allow_same_uid: true" in got["default"]
    assert "own uid=65534" in res.stderr  # the warning, once allowed
    if not got["namespaces"]:
        pytest.skip("this host gives an unprivileged user no namespaces (user namespaces "
                    "refused): the run directory would be visible; refusal checked above")
    rc, stdout, stderr, unisolated = got["allowed"]
    assert rc == 0, stderr
    seen = json.loads(stdout)
    assert seen["uid"] == NOBODY  # the worker's own uid: what allow_same_uid accepts
    assert set(seen["files"].values()) == {errno.ENOENT}, seen["files"]
    assert any("worker's own uid" in u for u in unisolated), unisolated
