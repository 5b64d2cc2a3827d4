"""Latency distributions (astraflow.consumers.rollout.latency): quantiles measured from many
draws, specs refused with the bad key named, traces replayed, the sleep does not block the
loop; and solver_verifier's ``verifier_latency`` kwarg (recorded, counted, per-episode
deterministic)."""

from __future__ import annotations

import asyncio
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from rollout_helpers import ScriptedEngine

from astraflow.consumers.rollout.latency import (
    FixedLatency,
    LognormalLatency,
    PhasesLatency,
    TraceLatency,
    UniformLatency,
    parse_latency,
    wait,
)
from astraflow.consumers.rollout.runtime import Runtime, run_episode
from astraflow.core.errors import ConfigError
from astraflow.core.records import ChatMessage, Task

N = 40_000


def quantiles(spec: Any, qs: tuple[float, ...], n: int = N, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    xs = sorted(spec.sample(rng) for _ in range(n))
    return [xs[int(q * n)] for q in qs]


def test_lognormal_hits_its_p50_and_p99() -> None:
    spec = parse_latency({"type": "lognormal", "p50": 0.05, "p99": 2.0})
    assert isinstance(spec, LognormalLatency)
    assert spec.mu == pytest.approx(math.log(0.05))
    assert spec.quantile(0.5) == pytest.approx(0.05) and spec.quantile(0.99) == pytest.approx(2.0)
    p50, p90, p99 = quantiles(spec, (0.5, 0.9, 0.99))
    assert p50 == pytest.approx(0.05, rel=0.05)
    assert p99 == pytest.approx(2.0, rel=0.15)
    assert p90 == pytest.approx(spec.quantile(0.9), rel=0.08)


def test_fixed_uniform_and_numbers() -> None:
    assert parse_latency(None) is None
    fixed = parse_latency(0.25)
    assert isinstance(fixed, FixedLatency) and fixed.sample(random.Random(0)) == 0.25
    uni = parse_latency({"type": "uniform", "low": 1.0, "high": 3.0})
    assert isinstance(uni, UniformLatency)
    lo, mid, hi = quantiles(uni, (0.01, 0.5, 0.99))
    assert 1.0 <= lo < 1.1 and mid == pytest.approx(2.0, abs=0.05) and 2.9 < hi <= 3.0
    assert parse_latency(uni) is uni  # a spec passes through


def test_trace_file_lines_and_json(tmp_path: Path) -> None:
    lines = tmp_path / "lat.txt"
    lines.write_text("# seconds of a slow checker\n0.1\n\n0.2  # a slow one\n3\n")
    cyc = parse_latency({"type": "trace", "path": str(lines), "order": "cycle"})
    assert isinstance(cyc, TraceLatency) and cyc.values == [0.1, 0.2, 3.0]
    rng = random.Random(0)
    assert [cyc.sample(rng) for _ in range(5)] == [0.1, 0.2, 3.0, 0.1, 0.2]
    listed = tmp_path / "lat.json"
    listed.write_text(json.dumps([0.5] * 9 + [4.0]))
    samp = parse_latency({"type": "trace", "path": str(listed)})
    draws = [samp.sample(random.Random(i)) for i in range(400)]
    assert set(draws) == {0.5, 4.0} and 10 < draws.count(4.0) < 80
    assert samp.quantile(0.5) == 0.5 and samp.quantile(0.95) == 4.0


def test_parsed_mappings_are_cached_so_a_cycle_keeps_its_place(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("1\n2\n")
    spec = {"type": "trace", "path": str(path), "order": "cycle"}
    a, b = parse_latency(spec), parse_latency(dict(spec))
    assert a is b
    assert [a.sample(random.Random(0)), b.sample(random.Random(0))] == [1.0, 2.0]


@pytest.mark.parametrize(("spec", "expected"), [
    ({"type": "lognormal", "p50": 1.0, "p99": 0.5}, ["k.p99: must be > p50 (1)"]),
    ({"type": "lognormal", "p50": -1, "p99": 2}, ["k.p50: Input should be greater than 0"]),
    ({"type": "lognormal", "p50": 0.05}, ["k.p99: Field required"]),
    ({"type": "uniform", "low": 2, "high": 1}, ["k.high: must be >= low (2)"]),
    ({"type": "fixed", "seconds": 1, "jitter": 2}, ["k.jitter: unknown key for type fixed"]),
    ({"type": "fixed", "seconds": float("inf")}, ["k.seconds:"]),
    ({"type": "gamma", "k": 2}, ["k.type: unknown type 'gamma'; valid: fixed, uniform, "
                                 "lognormal, trace, phases"]),
    ({"dist": "lognormal", "p50": 1, "p99": 2}, ["k.type: missing (the key is 'type'"]),
    ({"type": "trace", "path": "/no/such/file"}, ["k: cannot read trace file"]),
    ("slow", ["k: expected a mapping with 'type'"]),
    (True, ["k: expected a mapping with 'type'"]),
])
def test_bad_specs_are_refused_naming_the_key(spec: Any, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_latency(spec, where="k")
    assert len(err.value.problems) == len(expected)
    for problem, want in zip(err.value.problems, expected, strict=True):
        assert problem.startswith(want), problem


@pytest.mark.parametrize("body", ["0.1\nabc\n", "0.1\n-2\n", "[0.1, \"x\"]", "[1, 2", "\n#\n"])
def test_bad_trace_files_are_refused(tmp_path: Path, body: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(body)
    with pytest.raises(ConfigError, match=r"k: trace file .*bad\.txt"):
        parse_latency({"type": "trace", "path": str(path)}, where="k")


def test_wait_sleeps_without_blocking_the_loop() -> None:
    async def go() -> tuple[float, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(ticker())
        waited = await wait(FixedLatency(type="fixed", seconds=0.05), random.Random(0))
        t.cancel()
        assert await wait(None, random.Random(0)) == 0.0
        return waited, ticks

    waited, ticks = asyncio.run(go())
    assert waited == 0.05 and ticks > 10  # the loop ran other work meanwhile


# -- solver_verifier's verifier_latency --------------------------------------------------------

def episode(tok: Any, *, kwargs: dict[str, Any], sample_index: int = 0) -> Any:
    engines = {"solver": ScriptedEngine(tok, ["6", "5"]),
               "verifier": ScriptedEngine(tok, ["VERDICT: reject"])}
    rt = Runtime.create(engines, reward="exact_match", sampling={"max_new_tokens": 50},
                        workflow_kwargs={"solver_verifier": kwargs})
    task = Task(id="q7", dataset="t", prompt=[ChatMessage(role="user", content="2+3=")],
                reference={"answer": "5"}, workflow="solver_verifier", n_samples=2)

    async def go() -> Any:
        try:
            return await run_episode(rt, task, sample_index)
        finally:
            await rt.close()

    return asyncio.run(go())


def test_verifier_latency_from_a_mapping_is_recorded_and_counted(ascii_tokenizer) -> None:
    spec = {"type": "lognormal", "p50": 0.01, "p99": 0.05}
    out = episode(ascii_tokenizer, kwargs={"verifier_latency": spec}, sample_index=1)
    assert out.error is None, out.error
    # drawn from the episode's own seed: the pipeline and the lockstep bench wait the same
    expected = parse_latency(spec).sample(random.Random("q7/1"))
    assert out.ctx.timings["verifier_latency"] == expected
    assert out.ctx.counters["verifier_latency_waits"] == 1.0
    assert out.ctx.counters["verifier_latency_s"] == expected
    assert out.ctx.counters["verifier_retries"] == 1.0  # the episode went on as without it
    assert {d.policy: d.reward for d in out.drafts} == {"solver": 1.0, "verifier": 1.0}


def test_no_verifier_latency_by_default(ascii_tokenizer) -> None:
    out = episode(ascii_tokenizer, kwargs={})
    assert "verifier_latency" not in out.ctx.timings
    assert "verifier_latency_waits" not in out.ctx.counters


def test_a_bad_verifier_latency_fails_the_episode_naming_the_key(ascii_tokenizer) -> None:
    out = episode(ascii_tokenizer, kwargs={"verifier_latency": {"type": "lognormal", "p50": 1}})
    assert out.error is not None
    assert "rollout.workflow.kwargs.solver_verifier.verifier_latency.p99" in out.error


def test_phases_follow_the_wall_clock_so_every_process_agrees() -> None:
    spec = parse_latency({"type": "phases", "phases": [[2.0, 60], [0.2, 30]]}, where="x")
    assert isinstance(spec, PhasesLatency)
    rng = random.Random(0)
    for t, want in ((0.0, 2.0), (59.9, 2.0), (60.0, 0.2), (89.9, 0.2), (90.0, 2.0),
                    (90 * 1000 + 61.0, 0.2)):
        spec._clock = lambda t=t: t
        assert spec.sample(rng) == want, t
    assert spec.quantile(0.5) == 2.0  # 2/3 of the cycle waits 2 s
    assert spec.quantile(0.3) == 0.2
    moved = parse_latency({"type": "phases", "phases": [[2.0, 60], [0.2, 30]], "start": 1000},
                          where="x")
    moved._clock = lambda: 1000.0 + 65
    assert moved.sample(rng) == 0.2
    with pytest.raises(ConfigError, match="duration > 0"):
        parse_latency({"type": "phases", "phases": [[1.0, 0]]}, where="x")
