"""The ``code`` reward: run the completion's program against the task's tests in the sandbox.

The program (the completion's last fenced code block, else its text) followed by
``reference["tests"]`` scores 1.0 when it exits 0 within the sandbox's limits (:mod:`.sandbox`),
else 0.0. A sandbox that cannot start ``python`` (default: the worker's interpreter) raises
:class:`~.sandbox.SandboxError`, a counted reward failure rather than a 0; the component
``sandbox_unisolated`` is 1.0 where the host could not isolate the program fully.
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
