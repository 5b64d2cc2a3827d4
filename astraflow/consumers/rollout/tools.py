"""Tools a workflow's model may call: Python callables by name, each call with a timeout.

>>> @TOOLS.register("add")
... def add(a: float, b: float) -> float:
...     return a + b

Tools take keyword arguments (a JSON object) or positional ones (a JSON list) and may be async.
Only registered names are called. A call never raises into the workflow: a failure is a
:class:`ToolResult` with ``ok`` false and an error the model sees. Each sync call runs in a
thread of its own, so a hung tool holds only that thread (:data:`ABANDONED` counts them).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import math
import operator
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from astraflow.core.errors import AstraflowError
from astraflow.core.registry import Registry

TOOLS: Registry[Callable[..., Any]] = Registry("tool", group="astraflow.tools")
MAX_OUTPUT_CHARS = 4096
ABANDONED = [0]  # sync tool calls that timed out and still run (their threads), per process


@dataclass(frozen=True, slots=True)
class ToolResult:
    name: str
    output: str  # what goes back into the conversation (the error text when not ok)
    ok: bool
    error: str | None = None
    timed_out: bool = False
    seconds: float = 0.0


async def call_tool(name: str, arguments: Mapping[str, Any] | Sequence[Any] | None = None, *,
                    timeout: float = 10.0, registry: Registry[Callable[..., Any]] = TOOLS,
                    max_output_chars: int = MAX_OUTPUT_CHARS) -> ToolResult:
    """Call tool ``name`` with ``arguments`` (keyword arguments, or a list of positional
    ones) under ``timeout`` seconds."""
    start = time.monotonic()

    def fail(msg: str, *, timed_out: bool = False) -> ToolResult:
        return ToolResult(name, f"error: {msg}", False, msg, timed_out, time.monotonic() - start)

    if name not in registry:  # the name is the model's text: never a path to import
        return fail(f"unknown tool {name!r}; available: {', '.join(registry.names())}")
    fn = registry.resolve(name)
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = {}
    if isinstance(arguments, Mapping):
        kwargs = arguments
    elif isinstance(arguments, (list, tuple)):
        args = tuple(arguments)
    elif arguments is not None:
        return fail(f"arguments of {name!r} must be a JSON object or list, got "
                    f"{type(arguments).__name__}")
    try:
        if inspect.iscoroutinefunction(fn):
            out = await asyncio.wait_for(fn(*args, **kwargs), timeout)
        else:
            out = await asyncio.wait_for(_in_thread(fn, args, kwargs), timeout)
    except TimeoutError:
        return fail(f"tool {name!r} timed out after {timeout:g} s", timed_out=True)
    except TypeError as e:
        return fail(f"bad arguments for {name!r}: {e}")
    except Exception as e:  # noqa: BLE001 - a tool's failure is reported to the model
        return fail(f"tool {name!r} raised {type(e).__name__}: {e}")
    try:
        text = out if isinstance(out, str) else str(out)
    except Exception as e:  # noqa: BLE001 - an unprintable result is the tool's failure
        return fail(f"tool {name!r} returned a {type(out).__name__} that cannot be printed "
                    f"({type(e).__name__}: {e})")
    if len(text) > max_output_chars:
        text = text[:max_output_chars] + f"... [{len(text) - max_output_chars} chars cut]"
    return ToolResult(name, text, True, None, False, time.monotonic() - start)


async def _in_thread(fn: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: Mapping[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` in a daemon thread of its own; awaiting it can be cancelled
    (a timeout) while the thread runs on, counted in :data:`ABANDONED` until it ends."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()
    lock = threading.Lock()
    state = {"abandoned": False, "finished": False}

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def run() -> None:
        try:
            value, ok = fn(*args, **kwargs), True
        except BaseException as e:  # noqa: BLE001 - handed back to the awaiting coroutine
            value, ok = e, False
        with lock:
            state["finished"] = True
            if state["abandoned"]:
                ABANDONED[0] -= 1
                return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=run, name=f"af-tool-{getattr(fn, '__name__', 'tool')}",
                     daemon=True).start()
    try:
        return await fut
    except asyncio.CancelledError:
        with lock:
            if not state["finished"]:
                state["abandoned"] = True
                ABANDONED[0] += 1
        raise


# ---------------------------------------------------------------------------------------------
# built-in tools
# ---------------------------------------------------------------------------------------------

MAX_DIGITS = 1000  # of any number the calculator makes: a literal, a step, the result
MAX_EXPRESSION_CHARS = 2000
_MAX_BITS = math.ceil(MAX_DIGITS * math.log2(10))

_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Pow: "**"}


class CalculatorError(AstraflowError, ValueError):
    """An expression the calculator refuses to compute (too long, or a number too large)."""


def _result_bits(op: type, a: Any, b: Any) -> float:
    """An upper bound on the bits of integer ``a op b`` (0: it is not an int that can grow:
    floats overflow on their own, and //, % and / make nothing larger than their operands)."""
    if not (isinstance(a, int) and isinstance(b, int)):
        return 0.0
    if op is ast.Mult:
        return a.bit_length() + b.bit_length()
    if op is ast.Pow:
        if b <= 0 or abs(a) <= 1:  # a float, or 0 / 1 / -1
            return 0.0
        return math.inf if b.bit_length() > 64 else b * math.log2(abs(a))
    if op in (ast.Add, ast.Sub):
        return max(a.bit_length(), b.bit_length()) + 1.0
    return 0.0


def _eval(node: ast.AST) -> float | int:
    """Evaluate an arithmetic expression, sizing each step before computing it: nothing past
    :data:`MAX_DIGITS` is ever made (big-int arithmetic holds the GIL, so a step that ran for
    minutes would stall the worker's event loop, tool timeout or not)."""
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(
            node.value, bool):
        if isinstance(node.value, int) and node.value.bit_length() > _MAX_BITS:
            raise CalculatorError(f"a number with more than {MAX_DIGITS} digits is more than "
                                  "the calculator takes")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        bits = _result_bits(type(node.op), left, right)
        if bits > _MAX_BITS:
            digits = "an astronomical number of" if math.isinf(bits) else (
                f"about {bits * math.log10(2):.0f}")
            raise CalculatorError(
                f"refused: {_short(left)} {_SYMBOLS[type(node.op)]} {_short(right)} would have "
                f"{digits} digits, more than {MAX_DIGITS} digits (the calculator's limit)")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def _short(v: Any) -> str:
    """A number as the model can read it in an error: big ints by their size."""
    if isinstance(v, int) and v.bit_length() > 64:
        return f"<a {len(str(abs(v)))}-digit number>"
    return repr(v)


@TOOLS.register("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / // % **, parentheses); no names, no calls;
    numbers of up to :data:`MAX_DIGITS` digits (a step that would make a larger one is refused
    before it is computed)."""
    text = str(expression)
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression of {len(text)} characters is longer than "
                              f"{MAX_EXPRESSION_CHARS}")
    value = _eval(ast.parse(text, mode="eval"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _binary(op: str, name: str, a: Any, b: Any) -> str:
    """``a <op> b`` through :func:`calculator`, numbers only (``name``: the tool, for the
    error the model sees)."""
    for v in (a, b):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} takes two numbers, got {v!r}")
    return calculator(f"({a}){op}({b})")


@TOOLS.register("mul")
def mul(a: int | float, b: int | float) -> str:
    """``a * b`` (numbers only): the agent_tools example's calculator, ``<tool>mul(17,23)</tool>``."""
    return _binary("*", "mul", a, b)


@TOOLS.register("add")
def add(a: int | float, b: int | float) -> str:
    """``a + b`` (numbers only)."""
    return _binary("+", "add", a, b)


@TOOLS.register("python")
def python(code: str, timeout: float = 5.0) -> str:
    """Run Python code in the sandbox (no network, CPU/memory/process/output limits); returns
    its stdout, and stderr when it failed."""
    from astraflow.consumers.rollout.rewards.sandbox import SandboxLimits, run_python

    res = run_python(str(code), limits=SandboxLimits(timeout_s=min(float(timeout), 30.0)))
    if res.ok:
        return res.stdout
    why = "timed out" if res.timed_out else f"exit status {res.returncode}"
    return f"{res.stdout}\n[{why}]\n{res.stderr[-1000:]}".strip()
