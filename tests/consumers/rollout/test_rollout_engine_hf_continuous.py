"""The hf engine with continuous batching: requests join a running batch at a step boundary
without changing any sampled token's logprob; weight updates, limits, close and failures."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
from test_rollout_engine_hf import TOL, teacher_forced
from waiting import wait_for

from astraflow.consumers.rollout.batcher import Batcher
from astraflow.consumers.rollout.engines import EngineError, GenRequest, GenResult, build_engine
from astraflow.consumers.rollout.engines.hf import HFEngine
from astraflow.consumers.rollout.engines.hf_continuous import check_mergeable, merge_caches
from astraflow.consumers.rollout.runtime import Runtime, run_episode
from astraflow.core.records import ChatMessage, Task

WAIT = 60.0  # seconds any future or event may take on a busy 2-core machine
LOOK = 0.002  # seconds between looks of a wait_for: overlaps are short, look often


def make(path: Path, **kw: Any) -> HFEngine:
    return build_engine("hf", model_path=path, threads=1, seed=1, continuous=True,
                        **kw)  # type: ignore[return-value]


def test_mid_batch_joins_change_no_logprob(ascii_dir: Path) -> None:
    engine = make(ascii_dir)
    engine.eos = set()  # only the length limit ends a sequence: long overlaps
    tok = engine.tokenizer
    texts = ["a", "hello there, how are you", "xy", "the quick brown fox jumps", "0123456789",
             "q", "tool result: 42"]
    prompts = [tok(t)["input_ids"] for t in texts]
    lengths = [3, 12, 20, 6, 15, 9, 4]
    # iteration -> requests submitted then (1: before the first step, so 0 and 1 start together)
    joins_at = {1: [1], 2: [2], 3: [3, 4], 6: [5], 9: [6]}
    futs: dict[int, Future[GenResult]] = {}
    widths_ok: list[bool] = []

    def submit(i: int) -> None:
        futs[i] = engine.submit(GenRequest(prompts[i], max_new_tokens=lengths[i]))

    def hook(it: int) -> None:  # the decode thread, at a boundary
        rows = engine.decoder.rows
        if rows:  # leading all-pad columns are trimmed: the width is the longest row's
            widths_ok.append(engine.decoder._att.shape[1] == max(
                len(r.req.prompt_ids) + len(r.toks) - 1 for r in rows))
        for i in joins_at.get(it, []):
            submit(i)

    engine.step_hook = hook
    submit(0)
    wait_for(lambda: len(futs) == len(prompts), WAIT, every=LOOK)
    results = {i: f.result(WAIT) for i, f in futs.items()}
    engine.close()
    for i, r in results.items():
        assert len(r.token_ids) == lengths[i] and r.finish_reason == "length"
        assert len(r.logprobs) == len(r.versions) == lengths[i]
        ref = teacher_forced(engine, prompts[i], r.token_ids, 1.0, 1.0)
        assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < TOL, i
    assert engine.decoder.joins == 5  # every late request joined a running batch
    assert engine.decoder.max_rows >= 4
    assert widths_ok and all(widths_ok)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (1.3, 0.8), (0.0, 1.0)])
def test_joins_keep_logprobs_under_any_sampling(arith_dir: Path, temperature: float,
                                                top_p: float) -> None:
    engine = make(arith_dir)
    tok = engine.tokenizer
    prompts = [tok(t)["input_ids"] for t in ("1+1=", "12+34=", "987*6=", "5-55=", "3=")]
    futs: dict[int, Future[GenResult]] = {}

    def submit(i: int) -> None:
        futs[i] = engine.submit(GenRequest(prompts[i], max_new_tokens=6,
                                           temperature=temperature, top_p=top_p))

    engine.step_hook = lambda it: submit(it) if it in (2, 3, 4) else None
    engine.eos = set()
    submit(0)
    submit(1)
    wait_for(lambda: len(futs) == 5, WAIT, every=LOOK)
    for i, f in futs.items():
        r = f.result(WAIT)
        ref = teacher_forced(engine, prompts[i], r.token_ids, temperature, top_p)
        assert max(abs(a - b) for a, b in zip(ref, r.logprobs, strict=True)) < TOL
    engine.close()


def test_joined_requests_share_forward_passes(arith_dir: Path) -> None:
    engine = make(arith_dir)
    engine.eos = set()
    tok = engine.tokenizer
    n = 8
    futs: list[Future[GenResult]] = []

    def hook(it: int) -> None:
        if it in (2, 3):
            futs.append(engine.submit(GenRequest(tok("7+8=")["input_ids"], max_new_tokens=n)))

    engine.step_hook = hook
    futs.append(engine.submit(GenRequest(tok("1+2=")["input_ids"], max_new_tokens=n)))
    wait_for(lambda: len(futs) == 3, WAIT, every=LOOK)
    for f in futs:
        assert len(f.result(WAIT).token_ids) == n
    engine.close()
    # alone, each request takes n forward passes (a prefill, n - 1 decoding steps): 3n in all;
    # together: n + 2 decoding iterations, two of which also prefill a newcomer
    assert engine.steps == (n + 2) + 2 < 3 * n
    assert engine.decoder.max_rows == 3


def test_weight_update_lands_between_steps(arith_dir: Path) -> None:
    engine = make(arith_dir)
    engine.eos = set()
    tok = engine.tokenizer
    target = engine.weight_target()
    updated: list[int] = []

    def update() -> int:
        with torch.no_grad():
            for p in engine.model.parameters():
                p.add_(0.01)
        target.finish_version(1)
        updated.append(engine.decoder.iterations)
        return 1

    late: list[Future[GenResult]] = []
    threads: list[threading.Thread] = []

    def hook(it: int) -> None:
        if it == 3:  # queue an update from another thread; it lands at this very boundary
            t = threading.Thread(target=engine.update_weights, args=(update,))
            threads.append(t)
            t.start()
            wait_for(lambda: bool(engine.gate._pending), WAIT, every=LOOK)
        if it == 5:
            late.append(engine.submit(GenRequest(tok("5+5=")["input_ids"], max_new_tokens=3)))

    engine.step_hook = hook
    early = engine.submit(GenRequest(tok("11+22=")["input_ids"], max_new_tokens=6))
    r = early.result(WAIT)
    threads[0].join(WAIT)
    assert updated == [3]
    assert r.versions == [0, 0, 1, 1, 1, 1]  # iterations 1 and 2 before, 3.. after
    assert late[0].result(WAIT).versions == [1, 1, 1]
    assert engine.update_weights(lambda: "idle") == "idle"  # idle engine: runs at once
    engine.close()


def test_max_batch_size_is_respected(arith_dir: Path) -> None:
    engine = make(arith_dir, max_batch_size=2)
    engine.eos = set()
    tok = engine.tokenizer
    sizes: list[int] = []
    engine.step_hook = lambda it: sizes.append(len(engine.decoder.rows))
    futs = [engine.submit(GenRequest(tok(f"{i}+{i}=")["input_ids"], max_new_tokens=2 + i))
            for i in range(5)]
    results = [f.result(WAIT) for f in futs]
    assert [len(r.token_ids) for r in results] == [2, 3, 4, 5, 6]
    again = engine.generate([GenRequest(tok("9+9=")["input_ids"], max_new_tokens=k)
                             for k in (1, 2, 3)])  # the batch API goes through submit
    engine.close()
    assert [len(r.token_ids) for r in again] == [1, 2, 3]
    assert max(sizes) == engine.decoder.max_rows == 2


def test_context_limit_finishes_length(arith_dir: Path) -> None:
    engine = make(arith_dir)
    engine.eos = set()
    tok = engine.tokenizer
    long_prompt = tok("1" * 61)["input_ids"]  # 62 of the model's 64 positions
    assert len(long_prompt) == 62
    late: list[Future[GenResult]] = []

    def hook(it: int) -> None:
        if it == 2:  # joins a running batch whose rows are shorter
            late.append(engine.submit(GenRequest(long_prompt, max_new_tokens=50)))

    engine.step_hook = hook
    short = engine.submit(GenRequest(tok("1+1=")["input_ids"], max_new_tokens=10))
    full = engine.submit(GenRequest(tok("1" * 63)["input_ids"], max_new_tokens=5))
    assert full.result(WAIT).token_ids == [] and full.result().finish_reason == "length"
    assert len(short.result(WAIT).token_ids) == 10
    wait_for(lambda: bool(late), WAIT, every=LOOK)
    r = late[0].result(WAIT)
    assert len(r.token_ids) == 2 and r.finish_reason == "length"
    with pytest.raises(EngineError, match="empty prompt"):
        engine.submit(GenRequest([], max_new_tokens=3)).result(WAIT)
    engine.close()


def test_close_fails_pending_and_running_requests(arith_dir: Path) -> None:
    engine = make(arith_dir, max_batch_size=1)
    engine.eos = set()
    tok = engine.tokenizer
    started = threading.Event()

    def hook(it: int) -> None:  # hold the decode thread mid-request until close is asked
        if it == 2:
            started.set()
            wait_for(lambda: engine.decoder._stop, WAIT, every=LOOK)

    engine.step_hook = hook
    futs = [engine.submit(GenRequest(tok("1+1=")["input_ids"], max_new_tokens=40))
            for _ in range(3)]
    assert started.wait(WAIT)
    engine.close()
    assert not engine.decoder._thread.is_alive()
    for f in futs:
        with pytest.raises(EngineError, match="closed"):
            f.result(WAIT)
    with pytest.raises(EngineError, match="closed"):
        engine.submit(GenRequest(tok("1+1=")["input_ids"])).result(WAIT)


def test_failed_forward_fails_its_requests_and_the_engine_goes_on(arith_dir: Path) -> None:
    engine = make(arith_dir)
    engine.eos = set()
    tok = engine.tokenizer
    real = engine._forward
    calls = {"n": 0}

    def flaky(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated device error")
        return real(*args)

    engine._forward = flaky  # type: ignore[method-assign]
    futs: list[Future[GenResult]] = []

    def submit() -> None:
        futs.append(engine.submit(GenRequest(tok("1+1=")["input_ids"], max_new_tokens=5)))

    engine.step_hook = lambda it: submit() if it == 1 else None  # prefilled with the first
    submit()
    wait_for(lambda: len(futs) == 2, WAIT, every=LOOK)
    for f in futs:
        with pytest.raises(EngineError, match="simulated device error"):
            f.result(WAIT)
    r = engine.submit(GenRequest(tok("2+2=")["input_ids"], max_new_tokens=4)).result(WAIT)
    assert len(r.token_ids) == 4
    assert engine.decoder.failures == 1
    engine.close()


def test_unmergeable_cache_is_refused() -> None:
    with pytest.raises(EngineError, match="continuous: false"):
        check_mergeable(((torch.zeros(1), torch.zeros(1)),))


def test_merge_pads_the_narrower_cache_on_the_left() -> None:
    from transformers.cache_utils import DynamicCache

    a, b = DynamicCache(), DynamicCache()
    a.update(torch.ones(2, 1, 3, 4), torch.ones(2, 1, 3, 4), 0)
    b.update(torch.full((1, 1, 5, 4), 2.0), torch.full((1, 1, 5, 4), 2.0), 0)
    merged = merge_caches(a, b)
    keys = merged.layers[0].keys
    assert keys.shape == (3, 1, 5, 4)
    assert keys[:2, :, :2].eq(0).all() and keys[:2, :, 2:].eq(1).all()
    assert keys[2].eq(2).all()


def test_static_engine_has_no_submit(arith_dir: Path) -> None:
    engine = build_engine("hf", model_path=arith_dir, threads=1)
    assert engine.continuous is False
    with pytest.raises(EngineError, match="continuous=True"):
        engine.submit(GenRequest([1]))  # type: ignore[attr-defined]


def test_batcher_awaits_the_engine_futures(arith_dir: Path) -> None:
    engine = make(arith_dir, max_batch_size=8)
    assert engine.continuous is True
    tok = engine.tokenizer
    n = 24

    async def main() -> tuple[list[GenResult], Batcher]:
        b = Batcher(engine)

        async def episode(i: int) -> GenResult:
            await asyncio.sleep(0.001 * (i % 5))  # arrivals spread over time
            first = await b.generate(GenRequest(tok(f"{i}+1=")["input_ids"],
                                                max_new_tokens=2 + i % 7))
            return await b.generate(GenRequest(tok(f"{i}*2=")["input_ids"] + first.token_ids,
                                               max_new_tokens=3))
        try:
            return await asyncio.wait_for(asyncio.gather(*(episode(i) for i in range(n))),
                                          WAIT), b
        finally:
            await b.close()

    results, batcher = asyncio.run(main())
    engine.close()
    assert len(results) == n and all(1 <= len(r.token_ids) <= 3 for r in results)
    assert batcher.requests == 2 * n and batcher.batches == 0  # the engine forms the batches
    assert batcher.tokens >= n
    assert not batcher._pool._threads  # no thread per request: the futures are awaited
    assert 1 < engine.decoder.max_rows <= 8


def test_a_cancelled_request_leaves_the_batch(arith_dir: Path) -> None:
    engine = make(arith_dir)
    engine.eos = set()
    tok = engine.tokenizer
    started = threading.Event()
    engine.step_hook = lambda it: started.set() if it == 2 else None
    doomed = engine.submit(GenRequest(tok("1+1=")["input_ids"], max_new_tokens=60))
    assert started.wait(WAIT)
    assert doomed.cancel()  # what asyncio.wrap_future does when its episode is cancelled
    wait_for(lambda: not engine.decoder.rows, WAIT, every=LOOK)
    r = engine.submit(GenRequest(tok("2+2=")["input_ids"], max_new_tokens=3)).result(WAIT)
    assert len(r.token_ids) == 3
    engine.close()


def test_concurrent_episodes_share_decoding_steps_and_the_batcher_reports_it(
        arith_dir: Path) -> None:
    """Episodes issued the way the worker issues them (a task's samples started
    together, each awaiting its generation through the runtime's batcher) are decoded in
    shared steps, by the engine's own count of sequences per step; and the batcher's mean
    batch is that count. It was requests per batcher call, one per request with an engine
    that batches itself, so bench/rollout.py printed a mean batch of 1.0 for a worker whose
    engine decoded some 59 sequences a step."""
    engine = make(arith_dir, max_batch_size=64)
    engine.eos = set()  # every episode decodes all its tokens
    n, new = 16, 6
    task = Task(id="t34", dataset="test", prompt=[ChatMessage(role="user", content="12+34=")],
                reference={"answer": "46"}, n_samples=n)

    async def main() -> tuple[list[Any], float | None]:
        runtime = Runtime.create({"default": engine}, sampling={"max_new_tokens": new})
        try:
            outs = await asyncio.wait_for(asyncio.gather(
                *(run_episode(runtime, task, i) for i in range(n))), WAIT)
            return outs, runtime.batcher("default").mean_batch
        finally:
            await runtime.close()

    outs, mean_batch = asyncio.run(main())
    engine.close()
    assert [o.error for o in outs] == [None] * n
    tokens = sum(sum(d.loss_mask) for o in outs for d in o.drafts)
    dec = engine.decoder
    assert tokens == n * new == dec.row_steps  # each sequence counted once per step it sampled in
    assert dec.max_rows == n  # all of them in one decoding step
    # fed one at a time they would take up to n * new steps of one sequence; together, `new`
    # steps of n (a step boundary falling between two submissions makes it a step or two more)
    assert mean_batch == dec.row_steps / dec.iterations >= n / 2
