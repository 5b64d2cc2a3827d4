"""The ``command`` actuator: a shell command template run with the target count (Slurm,
``kubectl scale``, anything else; docs/elastic-cluster.md).

Templates name ``{target}``, ``{current}``, ``{pool}`` and ``{run}``; braces that cannot be a
placeholder are left alone, ``{{`` and ``}}`` are literal braces, and an unknown name is a
:class:`~astraflow.core.errors.ConfigError` when the actuator is built. A failing call is
retried ``retries`` times, the delay doubling from ``backoff_s``; the outcome is an
:class:`~.actuation.Actuation`, never an exception.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from astraflow.consumers.scaler.actuation import Actuation
from astraflow.core.errors import ConfigError

log = logging.getLogger("astraflow.scaler")

#: the placeholders a command template may use
PLACEHOLDERS = ("target", "current", "pool", "run")
#: those a count_command may use (it runs before any target is known)
COUNT_PLACEHOLDERS = ("pool", "run")
#: the longest delay between two attempts
MAX_BACKOFF_S = 60.0
#: how much of a failing command's output goes into Actuation.error
ERROR_TAIL_CHARS = 500

# `{{`, `}}`, or `{name}` not preceded by `$` (a shell `${VAR}` is the shell's)
_TOKEN = re.compile(r"\{\{|\}\}|(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def template_fields(template: str) -> list[str]:
    """The placeholder names ``template`` uses, in order.

    >>> template_fields("kubectl get deploy/x -o jsonpath={.spec.replicas} # {pool} ${HOME}")
    ['pool']
    """
    return [m.group(1) for m in _TOKEN.finditer(template) if m.group(1)]


def check_template(template: str, where: str = "command",
                   valid: tuple[str, ...] = PLACEHOLDERS) -> None:
    """ConfigError naming every unknown placeholder of ``template`` and the valid ones."""
    unknown = [f for f in template_fields(template) if f not in valid]
    if unknown:
        names = ", ".join(f"{{{f}}}" for f in dict.fromkeys(unknown))
        valid_names = ", ".join(f"{{{p}}}" for p in valid)
        raise ConfigError(f"actuator.{where} {template!r}: unknown placeholder {names}; "
                          f"valid: {valid_names} (write {{{{ and }}}} for a literal brace)")


def render(template: str, values: Mapping[str, object]) -> str:
    """Fill ``template``'s placeholders; strings are shell-quoted (a name with no special
    character is left as it is), ``{{``/``}}`` become single braces.

    >>> render("scale --replicas={target} -l app={pool} {{x}} {.a}", {"target": 3, "pool": "p"})
    'scale --replicas=3 -l app=p {x} {.a}'
    """
    def sub(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return m.group(0)[0]
        value = values[m.group(1)]
        return shlex.quote(value) if isinstance(value, str) else str(value)
    return _TOKEN.sub(sub, template)


def backoff_delays(retries: int, backoff_s: float) -> list[float]:
    """The sleeps before each retry: ``backoff_s`` doubling, capped at :data:`MAX_BACKOFF_S`.

    >>> backoff_delays(4, 20.0)
    [20.0, 40.0, 60.0, 60.0]
    """
    return [min(backoff_s * 2**i, MAX_BACKOFF_S) for i in range(retries)]


@dataclass(frozen=True)
class _Result:
    ok: bool
    stdout: str
    error: str


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= ERROR_TAIL_CHARS else "..." + text[-ERROR_TAIL_CHARS:]


def run_shell(command: str, timeout_s: float) -> _Result:
    """Run ``command`` with ``sh -c`` in its own process group; a timeout kills the whole
    group (a plain ``subprocess.run`` would kill the shell only and then wait for the pipes a
    grandchild still holds)."""
    try:
        proc = subprocess.Popen(command, shell=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace", start_new_session=True)
    except OSError as e:
        return _Result(False, "", f"cannot start: {e}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, err = proc.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipes
            proc.kill()
            out, err = "", ""
        tail = _tail(err or out)
        return _Result(False, out or "",
                       f"timed out after {timeout_s:g}s" + (f": {tail}" if tail else ""))
    if proc.returncode != 0:
        tail = _tail(err or out)
        return _Result(False, out, f"exit {proc.returncode}" + (f": {tail}" if tail else ""))
    return _Result(True, out, "")


class CommandActuator:
    """Scales a pool by running a shell command template with the target count.

    ``count_command`` (optional) prints the current size as an integer on stdout; without it
    :meth:`count` is None and the scaler uses the reporter's count of live workers.
    ``sleep`` is injectable so that tests see the backoff delays without waiting them out.
    """

    def __init__(self, command: str, *, run: str, pool: str,
                 count_command: str | None = None, timeout_s: float = 60.0,
                 retries: int = 3, backoff_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        problems = []
        for where, template, valid in (("command", command, PLACEHOLDERS),
                                       ("count_command", count_command, COUNT_PLACEHOLDERS)):
            if template is None:
                continue
            try:
                check_template(template, where, valid)
            except ConfigError as e:
                problems += e.problems
        if not command.strip():
            problems.append("actuator.command is empty; e.g. "
                            "'kubectl scale deployment/astraflow-rollout --replicas={target}'")
        if problems:
            raise ConfigError(problems)
        self.command = command
        self.count_command = count_command
        self.run = run
        self.pool = pool
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.sleep = sleep

    def _values(self, target: int, current: int) -> dict[str, object]:
        return {"target": target, "current": current, "pool": self.pool, "run": self.run}

    def count(self) -> int | None:
        """The pool's size from ``count_command`` (one try, no retries: the scaler falls back
        to the report's count); None without one or when it fails or prints no integer."""
        if self.count_command is None:
            return None
        cmd = render(self.count_command, {"pool": self.pool, "run": self.run})
        res = run_shell(cmd, self.timeout_s)
        if not res.ok:
            log.warning("actuator count_command failed pool=%s command=%r error=%r",
                        self.pool, cmd, res.error)
            return None
        text = res.stdout.strip()
        try:
            n = int(text)
        except ValueError:
            log.warning("actuator count_command printed no integer pool=%s command=%r "
                        "stdout=%r", self.pool, cmd, _tail(text))
            return None
        if n < 0:
            log.warning("actuator count_command printed a negative count pool=%s command=%r "
                        "stdout=%r", self.pool, cmd, text)
            return None
        return n

    def scale(self, target: int, current: int) -> Actuation:
        """Run the command for ``target``; retried with backoff on failure. Never raises."""
        t0 = time.monotonic()
        cmd = render(self.command, self._values(target, current))
        delays = backoff_delays(self.retries, self.backoff_s)
        error = ""
        attempts = 0
        for attempt in range(1, self.retries + 2):
            attempts = attempt
            res = run_shell(cmd, self.timeout_s)
            if res.ok:
                log.info("actuator command ok pool=%s target=%d current=%d attempts=%d "
                         "seconds=%.2f command=%r", self.pool, target, current, attempt,
                         time.monotonic() - t0, cmd)
                return Actuation(True, target, current, attempt, error,
                                 time.monotonic() - t0)
            error = res.error
            if attempt > self.retries:
                break
            delay = delays[attempt - 1]
            log.warning("actuator command failed pool=%s target=%d attempt=%d/%d "
                        "retry_in_s=%.1f command=%r error=%r", self.pool, target, attempt,
                        self.retries + 1, delay, cmd, error)
            self.sleep(delay)
        log.error("actuator command gave up pool=%s target=%d current=%d attempts=%d "
                  "command=%r error=%r", self.pool, target, current, attempts, cmd, error)
        return Actuation(False, target, current, attempts, error, time.monotonic() - t0)

    def close(self) -> None:
        """Nothing to release: the cluster keeps its pool."""
