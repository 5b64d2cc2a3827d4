"""The ``code`` reward: run the completion's program against the task's tests in the sandbox.

``reference["tests"]`` is Python source (a string or a list of statements, typically
``assert``\\ s) appended to the program extracted from the completion (the last fenced code
block, else the whole text). The reward is 1.0 when the program exits with status 0 inside the
limits, else 0.0; an infinite loop, a fork bomb, a huge print, a memory hog or a network call
only ever costs the sandbox (see :mod:`.sandbox`; ``disk_mb``: what it may write, in all). A program that exits with status 0 before the
tests run passes: the tests are plain code in the same process, not a separate judge.

``python``: the interpreter that runs the program (default: the worker's own). A sandbox that
cannot start it raises :class:`~.sandbox.SandboxError`, which the worker counts as a reward
failure (``reward_failures``, logged) rather than a plain 0. The component
``sandbox_unisolated`` is 1.0 when the host could not isolate the program fully (see
:func:`~.sandbox.missing`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from astraflow.consumers.rollout.rewards.base import REWARDS
from astraflow.consumers.rollout.rewards.sandbox import SandboxLimits, run_python

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(completion: str) -> str:
    """The last fenced code block (preferring python ones), else the whole completion."""
    blocks = _FENCE.findall(completion)
    if not blocks:
        return completion
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    return (python or [body for _lang, body in blocks])[-1]


@REWARDS.register("code")
def code_tests(completion: str, reference: Mapping[str, Any], *, timeout_s: float = 10.0,
               memory_mb: int = 1024, max_procs: int = 16, max_output_bytes: int = 64 * 1024,
               network: bool = False, python: str | None = None,
               disk_mb: int = 64) -> dict[str, float]:
    """1.0 if the extracted program passes ``reference["tests"]`` in the sandbox."""
    tests = reference.get("tests")
    if tests is None:
        raise KeyError(f"the task's reference has no 'tests' (it has {sorted(reference)})")
    if not isinstance(tests, str):
        tests = "\n".join(str(t) for t in tests)
    program = f"{extract_code(completion)}\n\n# --- tests ---\n{tests}\n"
    res = run_python(program, limits=SandboxLimits(
        timeout_s=timeout_s, memory_mb=memory_mb, max_procs=max_procs,
        max_output_bytes=max_output_bytes, network=network, disk_mb=disk_mb), python=python)
    return {"reward": 1.0 if res.ok else 0.0, "timed_out": float(res.timed_out),
            "sandbox_seconds": res.seconds, "sandbox_unisolated": float(bool(res.unisolated))}
