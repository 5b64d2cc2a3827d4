"""Tools that misbehave are cut off, the episode is scored and counted, and nothing else
stalls: a tool that hangs (sync or async), raises, returns something unprintable or returns
megabytes; positional tool calls; the tool latency of ``multi_turn_tools``."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from astraflow.consumers.rollout import tools as tools_mod
from astraflow.consumers.rollout.runtime import Runtime, run_episode
from astraflow.consumers.rollout.tools import TOOLS, call_tool
from astraflow.core.errors import ConfigError
from astraflow.core.records import ChatMessage, Task

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "agent_tools.yaml"
RELEASE = threading.Event()  # set at the end of the module: the hung sync tools return


@pytest.fixture(scope="module", autouse=True)
def _release_hung_threads():
    yield
    RELEASE.set()


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _hang_sync() -> str:
    RELEASE.wait(60)
    return "late"


async def _hang_async() -> str:
    await asyncio.sleep(60)
    return "late"


def _raises() -> str:
    raise KeyError("boom")


MISBEHAVING: dict[str, Callable[..., Any]] = {
    "hang_sync": _hang_sync, "hang_async": _hang_async, "raises": _raises,
    "garbage": lambda: Unprintable(), "megabytes": lambda: "x" * 5_000_000,
    "binary": lambda: bytes(range(256)) * 4,
}
for _name, _fn in MISBEHAVING.items():
    if _name not in TOOLS:
        TOOLS.add(_name, _fn)


def tool_caller(seen: str) -> str:
    """A rule for the ``rule_engine``: in an episode's first turn, call the tool the task's
    prompt names (``call NAME``); afterwards answer ``5``."""
    return "5" if "<tool>" in seen else f"<tool>{seen.split('call ')[-1]}()</tool>"


def task(i: int, tool: str) -> Task:
    return Task(id=f"t{i}", dataset="t", prompt=[ChatMessage(role="user", content=f"call {tool}")],
                reference={"answer": "5"}, workflow="multi_turn_tools", n_samples=1)


def run_all(rt: Runtime, tasks: Sequence[Task]) -> tuple[list[Any], float]:
    async def go() -> list[Any]:
        try:
            return list(await asyncio.gather(*(run_episode(rt, t, 0) for t in tasks)))
        finally:
            await rt.close()

    t0 = time.monotonic()
    outs = asyncio.run(asyncio.wait_for(go(), 30))
    return outs, time.monotonic() - t0


def test_positional_arguments_and_the_arithmetic_tools() -> None:
    async def go() -> list[Any]:
        return [await call_tool("mul", [17, 23]), await call_tool("add", {"a": 2, "b": 3}),
                await call_tool("mul", ["17", 23]), await call_tool("mul", [1, 2, 3]),
                await call_tool("mul", "17,23")]

    mul, add, text_arg, three, string = asyncio.run(go())
    assert (mul.ok, mul.output) == (True, "391") and (add.ok, add.output) == (True, "5")
    assert not text_arg.ok and "mul takes two numbers" in text_arg.output
    assert not three.ok and "bad arguments" in three.output
    assert not string.ok and "JSON object or list" in string.output


def test_each_misbehaving_tool_comes_back_as_an_error_or_a_cut_output() -> None:
    async def go() -> dict[str, Any]:
        return {n: await call_tool(n, {}, timeout=0.3, max_output_chars=100)
                for n in MISBEHAVING}

    res = asyncio.run(go())
    assert res["hang_sync"].timed_out and res["hang_async"].timed_out
    assert "timed out after 0.3 s" in res["hang_sync"].output
    assert not res["raises"].ok and "raised KeyError" in res["raises"].output
    assert not res["garbage"].ok and "cannot be printed" in res["garbage"].output
    big = res["megabytes"]
    assert big.ok and len(big.output) < 200 and "4999900 chars cut" in big.output
    assert res["binary"].ok and len(res["binary"].output) < 200


def test_a_tool_call_cannot_name_a_module_path(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The tool name comes from the model's text: only registered tools are called (a
    `rollout.tools` entry registers its path under a name); a path is neither imported nor
    called, whatever parser the workflow uses."""
    mark = tmp_path / "imported"
    (tmp_path / "af_planted_tool.py").write_text(
        f"open({str(mark)!r}, 'w').close()\ndef run():\n    return 'ran'\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    async def go() -> list[Any]:
        return [await call_tool("af_planted_tool:run", []), await call_tool("os:getcwd", [])]

    for res in asyncio.run(go()):
        assert not res.ok and "unknown tool" in res.output and "calculator" in res.output
    assert not mark.exists() and "af_planted_tool" not in sys.modules


# the limit is 1000 digits (about 3322 bits)
HUGE = {
    "chained powers": "((((((9**64)**64)**64)**64)**64)**64)",  # each exponent is small
    "products": "*".join(["(9**64)"] * 200),
    "power of a product": "(99999999999*99999999999)**64**1*(10**500)",
    "big exponent": "2**(10**100)",
    "long literal": "1" * 1200,
    "sum of powers": "+".join(["(10**999)"] * 3) + "*10",
}


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every value the calculator's arithmetic computes, in order."""
    seen: list[Any] = []

    def recording(fn: Callable[..., Any]) -> Callable[..., Any]:
        def op(*args: Any) -> Any:
            out = fn(*args)
            seen.append(out)
            return out
        return op

    monkeypatch.setattr(tools_mod, "_OPS", {k: recording(f) for k, f in tools_mod._OPS.items()})
    return seen


def test_the_calculator_refuses_huge_numbers_before_computing_them(computed: list[Any]) -> None:
    """Each step is sized before it is computed: nothing past the limit is ever made, so a
    completion cannot hold the worker's GIL with one tool call."""
    async def go() -> dict[str, Any]:
        return {k: await call_tool("calculator", {"expression": e}) for k, e in HUGE.items()}

    for what, res in asyncio.run(go()).items():
        assert not res.ok and not res.timed_out, (what, res.output)
        assert "more than 1000 digits" in res.output and "CalculatorError" in res.output, (
            what, res.output)
    assert computed  # the small steps did run
    assert max(v.bit_length() for v in computed if isinstance(v, int)) <= 3322


def test_the_calculator_still_computes_within_the_limit() -> None:
    calc = TOOLS.resolve("calculator")
    assert calc("2**100") == str(2**100)  # the old blanket cap on exponents (64) is gone
    assert calc("(10**64)**15") == "1" + "0" * 960  # 961 digits
    assert calc("12345678901234567890*98765432109876543210") == str(
        12345678901234567890 * 98765432109876543210)
    assert calc("2**-2") == "0.25" and calc("7//2") == "3" and calc("-(3-5)") == "2"
    assert calc("(10**999)//(10**998)") == "10" and calc("1**(10**100)") == "1"
    for bad, message in (("10.0**400", "OverflowError"), ("(10**900)/1e-200", "Overflow"),
                         ("x+1", "unsupported"), ("1" * 1500, "more than 1000 digits"),
                         ("1+" * 1500 + "1", "longer than")):
        res = asyncio.run(call_tool("calculator", {"expression": bad}))
        assert not res.ok and message in res.output, (bad, res.output)


def test_hung_tools_stall_nothing_else(ascii_tokenizer, rule_engine) -> None:
    # more hung sync calls than a default thread pool has threads (min(32, cpus + 4)): with a
    # shared pool the later calls would queue behind the hung ones and time out too
    hung_before = tools_mod.ABANDONED[0]
    n_hung = 12
    tasks = [task(i, "hang_sync") for i in range(n_hung)] + \
        [task(100 + i, "hang_async") for i in range(4)] + \
        [task(200 + i, name) for i, name in enumerate(["raises", "garbage", "megabytes"])]
    rt = Runtime.create({"default": rule_engine(ascii_tokenizer, tool_caller)}, reward="exact_match",
                        tool_timeout=0.5, sampling={"max_new_tokens": 64})
    outs, _ = run_all(rt, tasks)
    for out in outs:  # every episode ran to its answer and was scored
        assert out.error is None and out.drafts[0].reward == 1.0
        assert out.ctx.counters["tool_calls"] == 1.0
    timeouts = sum(o.ctx.counters.get("tool_timeouts", 0.0) for o in outs)
    failures = sum(o.ctx.counters.get("tool_failures", 0.0) for o in outs)
    assert timeouts == n_hung + 4 and failures == 2  # raises, garbage; megabytes is cut
    assert tools_mod.ABANDONED[0] - hung_before == n_hung  # their threads still run

    # with those threads still hung, a fresh sync call is answered at once (its own thread)
    async def fresh() -> Any:
        return await call_tool("mul", [6, 7], timeout=2.0)

    res = asyncio.run(fresh())
    # answered within its own 2 s timeout (a call queued behind the hung threads would time
    # out: ok False, timed_out True)
    assert res.ok and not res.timed_out and res.output == "42"


def test_tool_latency_is_drawn_per_episode_and_recorded(ascii_tokenizer, rule_engine) -> None:
    kwargs = {"multi_turn_tools": {"tool_latency": {"mul": 0.2, "*": {
        "type": "uniform", "low": 0.0, "high": 0.01}}}}
    tasks = [task(0, "mul"), task(1, "add")]
    rt = Runtime.create({"default": rule_engine(ascii_tokenizer, tool_caller)}, reward="exact_match",
                        workflow_kwargs=kwargs, sampling={"max_new_tokens": 64})
    outs, _ = run_all(rt, tasks)
    mul, add = (o.ctx for o in outs)
    assert mul.timings["tool_latency"] == pytest.approx(0.2)
    assert 0.0 <= add.timings["tool_latency"] <= 0.01
    assert mul.counters["tool_latency_waits"] == 1.0
    assert mul.counters["tool_latency_s"] == pytest.approx(0.2)


def test_a_bad_tool_latency_is_refused_at_its_key() -> None:
    from astraflow.config import load_experiment

    with pytest.raises(ConfigError) as e:
        load_experiment(EXAMPLE, ["rollout.workflow.kwargs.multi_turn_tools.tool_latency="
                                  "{mul: {type: lognormal, p50: 1.0, p99: 0.5}}"])
    (problem,) = e.value.problems
    assert "rollout.workflow.kwargs.multi_turn_tools.tool_latency" in problem
    assert "mul.p99: must be > p50" in problem
