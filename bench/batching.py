"""Continuous vs static batching of the hf engine under agentic load (requests arriving over time).

    python -m bench.batching                       # 64 episodes, 3 interleaved repeats
    python -m bench.batching --episodes 32 --repeats 1 --with-transformers

Load: ``--episodes`` concurrent episodes on one event loop, each a few (2-3) generate calls of
``max_new_tokens`` drawn from 2..40, separated by a random ``asyncio.sleep`` (up to
``--tool-latency`` s) that stands in for a tool call; each call's prompt is the episode's text
so far (its first prompt, what it generated, a tool result). Episodes start spread over
``--spread`` s. The workload is drawn from ``--seed``, the same in both arms.

* **static**: the hf engine behind the :class:`Batcher` as today (a batch runs to its end while
  new requests wait for it);
* **continuous**: the hf engine with ``continuous=True``: requests join the running batch at
  the next decoding step.

EOS is switched off in both engines so every call generates exactly its ``max_new_tokens``
(the random model would otherwise stop at different places in the two arms). Reported:
episodes/s and tokens/s of each (median of interleaved repeats after a warm-up), the mean
latency of one generate call, and continuous / static.

``--with-transformers`` adds an offline comparison on the first call of every episode (all
requests at once): our static ``generate`` in batches, our continuous engine (every request
submitted at once), and transformers' own continuous batching (paged attention, its manager's
``add_request`` with each request's ``max_new_tokens``). It is skipped, with the reason printed,
when the installed transformers lacks that API. Timing noise on shared 2-core machines is large.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.models import tiny_model

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 +-*=()"


@dataclass(frozen=True)
class Episode:
    start: float  # seconds after the load starts
    prompt: str
    calls: tuple[tuple[int, float, str], ...]  # (max_new_tokens, tool sleep after, tool text)


def workload(n: int, seed: int, spread: float, tool_latency: float) -> list[Episode]:
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, hi)))

    return [Episode(rng.uniform(0, spread), text(8, 48),
                    tuple((rng.randint(2, 40), rng.uniform(0, tool_latency), text(4, 20))
                          for _ in range(rng.randint(2, 3))))
            for _ in range(n)]


def make_engine(path: Path, continuous: bool, batch: int) -> Any:
    from astraflow.consumers.rollout.engines import build_engine

    engine = build_engine("hf", model_path=path, threads=1, seed=0, max_batch_size=batch,
                          continuous=continuous)
    engine.eos = set()  # type: ignore[attr-defined]  # exact lengths in both arms
    return engine


def run_load(engine: Any, episodes: list[Episode]) -> dict[str, float]:
    from astraflow.consumers.rollout.batcher import Batcher
    from astraflow.consumers.rollout.engines import GenRequest

    tok = engine.tokenizer
    latencies: list[float] = []

    async def episode(b: Batcher, ep: Episode) -> None:
        await asyncio.sleep(ep.start)
        ids = tok(ep.prompt)["input_ids"]
        for max_new, pause, tool in ep.calls:
            t0 = time.perf_counter()
            r = await b.generate(GenRequest(ids, max_new_tokens=max_new))
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(pause)  # the tool call
            ids = ids + r.token_ids + tok(tool, add_special_tokens=False)["input_ids"]

    async def main() -> tuple[float, int, int]:
        b = Batcher(engine)
        start = time.perf_counter()
        try:
            await asyncio.gather(*(episode(b, ep) for ep in episodes))
        finally:
            await b.close()
        return time.perf_counter() - start, b.tokens, b.requests

    secs, tokens, calls = asyncio.run(main())
    return {"s": secs, "eps": len(episodes) / secs, "tok_s": tokens / secs,
            "lat_ms": 1000 * statistics.mean(latencies), "calls": calls, "tokens": tokens}


def offline(path: Path, episodes: list[Episode], batch: int) -> None:
    """The first call of every episode, all at once: ours (static, continuous) vs transformers."""
    from astraflow.consumers.rollout.engines import GenRequest

    static, cont = make_engine(path, False, batch), make_engine(path, True, batch)
    tok = static.tokenizer
    prompts = [tok(ep.prompt)["input_ids"] for ep in episodes]
    lens = [ep.calls[0][0] for ep in episodes]
    reqs = [GenRequest(p, max_new_tokens=k) for p, k in zip(prompts, lens, strict=True)]
    rows = []
    t0 = time.perf_counter()
    toks = sum(len(r.token_ids) for i in range(0, len(reqs), batch)
               for r in static.generate(reqs[i:i + batch]))
    rows.append(("ours, static generate", time.perf_counter() - t0, toks))
    t0 = time.perf_counter()
    futs = [cont.submit(r) for r in reqs]
    toks = sum(len(f.result(600).token_ids) for f in futs)
    rows.append(("ours, continuous submit", time.perf_counter() - t0, toks))
    cont.close()
    hf = transformers_arm(static.model, prompts, lens, batch)
    if isinstance(hf, str):
        print(f"\ntransformers continuous batching skipped: {hf}")
    else:
        secs, n, busy = hf
        rows.append(("transformers CB (paged), with manager", secs, n))
        rows.append(("transformers CB, first request..last result", busy, n))
    print(f"\noffline: {len(reqs)} requests at once (first call of each episode)")
    print(f"{'arm':<44}{'seconds':>9}{'tokens':>8}{'tok/s':>9}")
    for name, s, n in rows:
        print(f"{name:<44}{s:>9.2f}{n:>8}{n / s:>9.0f}")


def transformers_arm(model: Any, prompts: list[list[int]], lens: list[int],
                     batch: int) -> tuple[float, int, float] | str:
    """Seconds (with its manager's start and stop), tokens, and seconds from the first request
    to the last result of transformers' continuous batching on the same requests, or why it
    could not run."""
    import transformers

    if not hasattr(model, "continuous_batching_context_manager"):
        return (f"transformers {transformers.__version__} has no "
                "model.continuous_batching_context_manager / generate_batch")
    from transformers import GenerationConfig

    cfg = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=max(lens),
                           eos_token_id=None, pad_token_id=model.config.pad_token_id)
    try:
        t0 = time.perf_counter()
        got: dict[str, Any] = {}
        with model.continuous_batching_context_manager(generation_config=cfg, block=True,
                                                       timeout=5) as manager:
            t1 = time.perf_counter()
            ids = [manager.add_request(p, max_new_tokens=k)
                   for p, k in zip(prompts, lens, strict=True)]
            deadline = time.monotonic() + 600
            while len(got) < len(ids) and time.monotonic() < deadline:
                r = manager.get_result(timeout=1)
                if r is not None and r.is_finished():
                    got[r.request_id] = r
                    t2 = time.perf_counter()
                elif r is None and not manager.is_running():
                    return "its generation thread stopped"
        secs = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - an optional arm: report why and go on
        return f"{type(e).__name__}: {e}"
    failed = [r.error for r in got.values() if r.error]
    if failed or len(got) < len(ids):
        return f"{len(ids) - len(got)} requests missing, errors: {failed[:2]}"
    return secs, sum(len(r.generated_tokens) for r in got.values()), t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.batching",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="max_batch_size of both engines")
    ap.add_argument("--tool-latency", type=float, default=0.05,
                    help="most seconds of one tool call")
    ap.add_argument("--spread", type=float, default=0.2, help="seconds episodes start over")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--with-transformers", action="store_true",
                    help="also time transformers' continuous batching (offline, same requests)")
    args = ap.parse_args()

    import logging

    for name in ("transformers", "ContinuousBatchingLogger"):
        logging.getLogger(name).setLevel(logging.ERROR)
    root = Path(tempfile.mkdtemp(prefix="af-bench-batching-"))
    path = tiny_model(root, "ascii", max_positions=512)
    episodes = workload(args.episodes, args.seed, args.spread, args.tool_latency)
    engines = {"static": make_engine(path, False, args.batch),
               "continuous": make_engine(path, True, args.batch)}
    warm = workload(8, args.seed + 1, 0.0, 0.0)
    for e in engines.values():
        run_load(e, warm)
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in engines}
    for _ in range(args.repeats):  # interleaved: both arms see the same machine noise
        for name, e in engines.items():
            runs[name].append(run_load(e, episodes))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for name, rs in runs.items()}
    calls = int(med["static"]["calls"])
    print(f"{args.episodes} episodes, {calls} generate calls, "
          f"{int(med['static']['tokens'])} tokens; median of {args.repeats}")
    print(f"{'arm':<12}{'seconds':>9}{'episodes/s':>12}{'tokens/s':>10}{'call ms':>9}")
    for name, m in med.items():
        print(f"{name:<12}{m['s']:>9.2f}{m['eps']:>12.1f}{m['tok_s']:>10.0f}{m['lat_ms']:>9.0f}")
    print(f"continuous / static episodes/s: {med['continuous']['eps'] / med['static']['eps']:.2f}x")
    engines["continuous"].close()
    if args.with_transformers:
        offline(path, episodes, args.batch)


if __name__ == "__main__":
    main()
