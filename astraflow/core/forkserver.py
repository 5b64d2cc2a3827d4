"""A fork server for the roles that load torch: started once, it imports torch, transformers
and the roles' modules, then forks each such role instead of starting a fresh interpreter.

:class:`ForkServer` runs ``python -m astraflow.core.forkserver`` and talks to it over
stdin/stdout, one JSON object a line; the forked child is set up as ``subprocess.Popen`` with
``start_new_session=True`` would set it up, and :class:`ForkedProcess` answers
``poll``/``wait`` like a Popen. Only the commands in :data:`FORKED` are forked;
``ASTRAFLOW_FORK_SERVER=0`` turns it off (docs/architecture.md)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from astraflow.core.metrics import PORT_ENV

ENV = "ASTRAFLOW_FORK_SERVER"
#: the `astraflow` subcommands forked from a server, and which: ``torch`` for the roles that
#: load it, ``light`` for the others (one server each: forked from the torch server, a light
#: role cost more CPU than a fresh process, its collections walking a heap it never uses)
FORKED = {"rollout": "torch", "train": "torch", "evaluate": "torch",
          "produce": "light", "policy": "light", "report": "light"}
#: what each server imports before it serves (a module missing here is skipped)
PRELOAD = {
    "torch": ("torch", "transformers", "safetensors.torch",
              "transformers.models.qwen2.modeling_qwen2",
              "transformers.models.llama.modeling_llama", "transformers.generation.utils",
              "astraflow.cli.app", "astraflow.consumers.rollout.worker",
              "astraflow.consumers.rollout.engines.hf", "astraflow.consumers.trainer.build",
              "astraflow.consumers.evaluator"),
    "light": ("astraflow.cli.app", "astraflow.config", "astraflow.run.roles",
              "astraflow.policies.stage", "astraflow.producers.producer",
              "astraflow.core.bus.embedded"),
}
APP = ("-m", "astraflow.cli.app")

log = logging.getLogger("astraflow.forkserver")


def enabled() -> bool:
    return hasattr(os, "fork") and os.environ.get(ENV, "1") not in ("0", "false", "no", "")


def forkable(argv: Sequence[str]) -> str | None:
    """The server (:data:`FORKED`) that forks ``argv``, an `astraflow` command run by this
    interpreter; None for any other command line."""
    if len(argv) > 3 and argv[0] == sys.executable and tuple(argv[1:3]) == APP:
        return FORKED.get(argv[3])
    return None


class ForkServerError(RuntimeError):
    """The server could not start a role (or is gone)."""


class ForkedProcess:
    """A role forked by the server, with the part of :class:`subprocess.Popen`'s interface the
    launcher uses: ``pid``, ``args``, ``returncode``, ``poll()``, ``wait(timeout)``."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ForkServer:
    """The launcher's end: starts the server on first use (with the environment of the first
    role it forks), sends requests, and a reader thread routes the server's answers and exit
    reports. Thread-safe."""

    def __init__(self, profile: str = "torch") -> None:
        if profile not in PRELOAD:
            raise ValueError(f"fork server profile {profile!r}: one of {sorted(PRELOAD)}")
        self.profile = profile
        self._lock = threading.Lock()          # one request at a time
        self._proc: subprocess.Popen[bytes] | None = None
        self._answers: list[dict[str, Any]] = []
        self._answered = threading.Condition()
        self._children: dict[int, ForkedProcess] = {}

    def start(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *,
              cwd: str | None = None) -> ForkedProcess:
        """Fork ``argv``, a ``[sys.executable, "-m", MODULE, *args]`` command line, with ``env``,
        output appended to ``log_path``: the child runs MODULE as ``python -m`` would. Raises
        :class:`ForkServerError` when the server cannot."""
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
            raise ForkServerError(f"not a `{sys.executable} -m MODULE` command: {argv[:3]}")
        request = {"module": argv[2], "argv": list(argv[3:]), "env": dict(env),
                   "cwd": cwd or os.getcwd(), "log": str(log_path)}
        with self._lock:
            proc = self._ensure(env)
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                proc.stdin.flush()
            except OSError as e:
                raise ForkServerError(f"the fork server is gone: {e}") from e
            answer = self._next_answer(proc)
        if "error" in answer:
            raise ForkServerError(answer["error"])
        child: ForkedProcess = answer["child"]
        return child

    def prestart(self, env: Mapping[str, str]) -> None:
        """Start the server now with ``env`` (a role's environment), so that it imports while
        the launcher does other work; returns at once."""
        with self._lock:
            self._ensure(env)

    def close(self) -> None:
        """End the server (its forked roles are not touched: they stop themselves)."""
        with self._lock:
            if self._proc is not None and self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(5)
            self._proc = None

    # -- the launcher's side ---------------------------------------------------------------

    def _ensure(self, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        from astraflow.core.launcher import LAUNCHER_PID_ENV  # (it imports this module)

        server_env = {k: v for k, v in env.items() if k not in (LAUNCHER_PID_ENV, PORT_ENV)}
        proc = subprocess.Popen([sys.executable, "-m", "astraflow.core.forkserver", self.profile],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=server_env, close_fds=True)
        self._proc = proc
        threading.Thread(target=self._read, args=(proc,), name="forkserver-reader",
                         daemon=True).start()
        return proc

    def _next_answer(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        with self._answered:
            while not self._answers:
                if proc.poll() is not None:
                    raise ForkServerError(f"the fork server ended (exit {proc.returncode})")
                self._answered.wait(0.5)
            return self._answers.pop(0)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            with self._answered:
                if "exit" in msg:  # (the server reports a pid before that pid's exit)
                    child = self._children.pop(int(msg["exit"]), None)
                    if child is not None:
                        child._exited(int(msg["code"]))
                    continue
                if "pid" in msg:
                    msg["child"] = self._children[int(msg["pid"])] = ForkedProcess(
                        int(msg["pid"]), msg.get("args", []))
                self._answers.append(msg)
                self._answered.notify_all()
        # the server is gone: its roles stop themselves (their parent changed); say they ended
        with self._answered:
            gone = list(self._children.values())
            self._children.clear()
            self._answered.notify_all()
        if gone:
            log.error("the fork server ended (exit %s) with %d role(s) running; they stop "
                      "themselves", proc.poll(), len(gone))
        for child in gone:
            child._exited(-signal.SIGKILL)


_servers: dict[str, ForkServer] = {}
_servers_lock = threading.Lock()


def server(profile: str = "torch") -> ForkServer:
    """This process's fork server of ``profile`` (made on first use)."""
    with _servers_lock:
        if profile not in _servers:
            _servers[profile] = ForkServer(profile)
        return _servers[profile]


# -- the server's side ----------------------------------------------------------------------

def _preload(profile: str) -> None:
    import gc
    import importlib

    for name in PRELOAD[profile]:
        try:
            importlib.import_module(name)
        except Exception as e:  # an optional part missing: the role imports what it needs
            print(f"fork server: not preloaded {name}: {e!r}", file=sys.stderr, flush=True)
    # What was imported lives as long as the roles: out of the collector's sight, so that a
    # forked role's collections neither walk it (CPU) nor touch its pages (copy-on-write).
    gc.collect()
    gc.freeze()


def _send(out: IO[bytes], msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg).encode() + b"\n")
    out.flush()


def _reap(out: IO[bytes]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(out, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(profile: str = "torch") -> None:
    """The server's loop: read requests from stdin, fork, report exits; end at EOF."""
    _preload(profile)
    from astraflow.core.launcher import LAUNCHER_PID_ENV

    os.environ.pop(LAUNCHER_PID_ENV, None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stdin = sys.stdin.buffer
    out = sys.stdout.buffer
    infd = stdin.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([infd, rfd], [], [], 1.0)
        if rfd in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(rfd, 4096)
        _reap(out)
        if infd not in ready:
            continue
        chunk = os.read(infd, 65536)
        if not chunk:  # the launcher is gone
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as e:
                _send(out, {"error": f"fork failed: {e}"})
                continue
            if pid == 0:
                _become(request, (infd, rfd, wfd, out.fileno()))  # never returns
            _send(out, {"pid": pid, "args": [sys.executable, "-m", request["module"],
                                             *request["argv"]]})


def _become(request: dict[str, Any], server_fds: Sequence[int]) -> None:
    """In the forked child: set up as a fresh ``python -m MODULE ARGV`` would be, then run
    it. Never returns: the command's end (SystemExit, or an exception) unwinds to the
    interpreter's own exit, as in a fresh interpreter (the server's loop has nothing to undo)."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        logfd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(devnull, 0)
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        for fd in {devnull, logfd, *server_fds} - {0, 1, 2}:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()  # as `python -m` has it (the environment's PYTHONPATH is not
        #                            read again: the server's, from its first request, holds)
        module = request["module"]
        # (before the environment is replaced: setproctitle takes room from the original one)
        _title([sys.executable, "-m", module, *request["argv"]])
        from astraflow.core.launcher import LAUNCHER_PID_ENV

        env = dict(request["env"])
        if LAUNCHER_PID_ENV in env:
            env[LAUNCHER_PID_ENV] = str(os.getppid())  # this server stands for the launcher
        os.environ.clear()
        os.environ.update(env)
        import io

        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stdin)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                      errors="backslashreplace")
        _fresh_state(env)
        # run as `python -m` runs it, afresh as __main__ (its imports stay loaded)
        sys.modules.pop(module, None)
        sys.argv = ["-m", *request["argv"]]  # runpy puts the module's file first
        import runpy
    except BaseException as e:  # the role cannot start: say so where its log would be
        with contextlib.suppress(BaseException):
            os.write(2, f"fork server: could not start {request.get('argv')}: {e!r}\n".encode())
        os._exit(127)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _title(argv: Sequence[str]) -> None:
    """Show the role's command line in ps and top, as a fresh process would (one string:
    /proc/PID/cmdline is not split into arguments); /proc/PID/comm stays the interpreter's
    name."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join(argv))
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(Path(sys.executable).name[:15])


def _fresh_state(env: Mapping[str, str]) -> None:
    """What a fresh interpreter would not share with its siblings: random seeds, and the
    thread count the environment asks for (the libraries read it when the server loaded
    them)."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS")
    if torch is not None and threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


if __name__ == "__main__":
    serve(sys.argv[1] if len(sys.argv) > 1 else "torch")
