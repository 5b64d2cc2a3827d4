"""Rewards (exact, numeric, math-verify, code) and the sandbox: an infinite loop, a fork bomb,
a huge print, a memory hog and a network call are all contained; a crash or timeout scores 0."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from astraflow.consumers.rollout.rewards import REWARDS, score
from astraflow.consumers.rollout.rewards.code import extract_code
from astraflow.consumers.rollout.rewards.sandbox import SandboxLimits, features, run_python

FAST = SandboxLimits(timeout_s=3.0)


def reward(name: str, completion: str, reference: dict, **kw: object) -> float:
    out = REWARDS.resolve(name)(completion, reference, **kw)
    return float(out["reward"] if isinstance(out, dict) else out)


def test_exact_and_numeric_match() -> None:
    assert reward("exact_match", " 46 ", {"answer": "46"}) == 1.0
    assert reward("exact_match", "460", {"answer": "46"}) == 0.0
    assert reward("exact_match", "Paris", {"answer": "paris"}, case_sensitive=False) == 1.0
    assert reward("numeric_match", "so the total is 1,234.50 dollars", {"answer": 1234.5}) == 1.0
    assert reward("numeric_match", "5 then 6", {"answer": "5"}) == 0.0  # the last number counts
    assert reward("numeric_match", "no number", {"answer": "5"}) == 0.0
    with pytest.raises(KeyError):
        reward("exact_match", "1", {"tests": "x"})


def test_user_reward_by_module_path() -> None:
    assert reward("rollout_helpers:length_reward", "abcd", {}, scale=0.5) == 2.0
    from astraflow.core.registry import RegistryError

    with pytest.raises(RegistryError, match="valid: code, exact_match, math, numeric_match"):
        REWARDS.resolve("nope")
    with pytest.raises(RegistryError, match="cannot import module 'no_such_pkg.mod'"):
        REWARDS.resolve("no_such_pkg.mod:fn")


def test_build_reward_for_code_outside_the_worker() -> None:
    from astraflow.consumers.rollout.config import RewardConfig
    from astraflow.consumers.rollout.rewards import build_reward

    assert build_reward(RewardConfig())("46", {"answer": "46"}) == 1.0
    fn = build_reward(RewardConfig(name="code", kwargs={"timeout_s": 5}))
    assert fn("def f():\n    return 1\n", {"tests": "assert f() == 1"}) == 1.0


def test_math_answers() -> None:
    assert reward("math", "The answer is $\\frac{1}{2}$", {"answer": "0.5"}) == 1.0
    assert reward("math", "so \\boxed{2\\sqrt{2}}", {"answer": "\\sqrt{8}"}) == 1.0
    assert reward("math", "\\boxed{3}", {"answer": "4"}) == 0.0
    assert reward("math", "I don't know", {"answer": "4"}) == 0.0


def test_code_reward_runs_the_tests() -> None:
    ref = {"tests": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]}
    good = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\n"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    assert reward("code", good, ref, timeout_s=5) == 1.0
    assert reward("code", bad, ref, timeout_s=5) == 0.0
    assert extract_code("```\nx = 1\n```\ntext\n```py\ny = 2\n```") == "y = 2\n"
    assert extract_code("print(1)") == "print(1)"


def test_sandbox_infinite_loop_is_killed() -> None:
    start = time.monotonic()
    res = run_python("while True:\n    pass\n", limits=FAST)
    assert res.timed_out and not res.ok and res.returncode < 0
    assert time.monotonic() - start < 60  # bounded (generous: machines stall)


def _processes() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def test_sandbox_fork_bomb_is_contained() -> None:
    before = _processes()
    code = ("import os\nn = 0\nfor _ in range(10_000):\n    try:\n        if os.fork() == 0:\n"
            "            while True: pass\n        n += 1\n    except OSError:\n        pass\n"
            "print(n, flush=True)\n")
    res = run_python(code, limits=SandboxLimits(timeout_s=5.0, max_procs=8))
    assert not res.ok or int(res.stdout.split()[0]) <= 8
    if res.stdout.strip():
        assert int(res.stdout.split()[0]) <= 8  # at most max_procs processes were started
    leftover = [p for p in _processes() - before if _is_sandbox(p)]
    assert leftover == []  # nothing it started survives it


def _is_sandbox(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"af-sandbox-" in f.read()
    except OSError:
        return False


def test_sandbox_subprocesses_follow_the_limit() -> None:
    res = run_python("import subprocess\nsubprocess.run(['true'])\nprint('ran')\n", limits=FAST)
    if features()["drop_uid"] or os.geteuid() != 0:
        assert res.ok and res.stdout.strip() == "ran"  # allowed up to max_procs
    else:  # root without a uid to drop to: new processes are refused outright
        assert not res.ok and "ran" not in res.stdout


def test_sandbox_huge_print_is_capped() -> None:
    res = run_python("while True:\n    print('x' * 10_000)\n",
                     limits=SandboxLimits(timeout_s=10.0, max_file_mb=2,
                                          max_output_bytes=1000))
    assert not res.ok and res.output_truncated
    assert len(res.stdout) <= 1000


def test_sandbox_memory_hog_fails() -> None:
    res = run_python("x = bytearray(4 * 1024**3)\nprint('allocated')\n",
                     limits=SandboxLimits(timeout_s=10.0, memory_mb=512))
    assert not res.ok and "allocated" not in res.stdout and "MemoryError" in res.stderr


def test_sandbox_has_no_network() -> None:
    code = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
            "except OSError as e:\n    print('blocked', type(e).__name__)\nelse:\n"
            "    print('connected')\n")
    res = run_python(code, limits=FAST)
    assert res.stdout.startswith("blocked"), res.stdout + res.stderr
    assert res.network_isolated == features()["network"]


def test_reward_crash_and_timeout_score_zero() -> None:
    def crash(completion: str, reference: dict) -> float:
        raise RuntimeError("reward bug")

    def slow(completion: str, reference: dict) -> float:
        time.sleep(1)
        return 1.0

    async def go() -> tuple:
        return (await score(crash, "x", {}), await score(slow, "x", {}, timeout=0.2),
                await score(REWARDS.resolve("exact_match"), "1", {"answer": "1"}))

    crashed, timed_out, fine = asyncio.run(go())
    assert crashed.failed and crashed.value == 0.0 and "reward bug" in (crashed.error or "")
    assert timed_out.failed and "timed out" in (timed_out.error or "")
    assert not fine.failed and fine.value == 1.0
