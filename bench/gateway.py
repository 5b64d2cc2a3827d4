"""The agent gateway's overhead: chat completions through the gateway over HTTP against the same
engine called directly (the ceiling), at 1, 16 and 64 concurrent sessions.

    python -m bench.gateway                  # 1, 16, 64 sessions, 3 repeats, ~2-3 minutes
    python -m bench.gateway --quick          # fewer requests, 1 repeat
    python -m bench.gateway --record memory  # sessions recorded in memory only
    python -m bench.gateway --model small --max-new-tokens 32 --requests 256  # ~5 minutes

Both arms use the hf engine on a model built here (no download) behind one ``Batcher``
(rollout's, the gateway's batching), the same prompt (``a+b=`` through the chat template) and
the same sampling (temperature 1, ``--max-new-tokens``). ``--model``: ``tiny`` is the
quickstart's (0.5M parameters, 64 positions), whose 4-token completions cost the engine ~0.25
ms each at 64 sessions, less than any Python HTTP stack takes to parse a request, so that arm
measures the gateway's fixed cost per request; ``small`` (hidden 512, 4 layers, 13M parameters,
256 positions) gives a completion an engine time nearer a real model's, where that fixed cost
is what the gateway adds:

* **direct**: ``--sessions`` coroutines, each awaiting ``batcher.generate`` ``--requests`` /
  sessions times in a row;
* **gateway**: the same through ``POST /sessions/{id}/v1/chat/completions`` (httpx's async
  client, or the official SDK with ``--sdk``), a new session every 4 calls, every call recorded:
  in memory (what the ``openai_agent`` workflow's gateway in a rollout worker does) and on an
  embedded bus, produced and flushed before each answer (what ``astraflow serve`` does). The
  clients run in a process of their own (an agent is not the gateway's process); the gateway
  and the engine share one (as in a rollout worker and in ``astraflow serve``).

Reported: requests/s (median of interleaved repeats), p50/p99 latency of one request, the
engine's mean batch, and gateway / direct requests/s. Timing noise on shared 2-core machines is large; nothing here
gates CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib.models import tiny_model

PROMPT = [{"role": "user", "content": "17+23="}]
TURNS = 4  # calls per session


#: --model: the tiny model's sizes (astraflow.models.tiny.build_model's keywords)
SIZES: dict[str, dict[str, int]] = {
    "tiny": {},
    "small": {"hidden": 512, "layers": 4, "heads": 8, "intermediate": 2048,
              "max_positions": 256},
}


def summary(seconds: float, latencies: list[float]) -> dict[str, float]:
    lat = sorted(latencies)
    return {"rps": len(lat) / seconds, "p50": 1e3 * lat[len(lat) // 2],
            "p99": 1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))]}


async def direct(batcher: Any, ids: list[int], sessions: int, per: int, max_new: int
                 ) -> dict[str, float]:
    from astraflow.consumers.rollout.engines import GenRequest

    latencies: list[float] = []

    async def session() -> None:
        for _ in range(per):
            t = time.perf_counter()
            await batcher.generate(GenRequest(list(ids), max_new_tokens=max_new,
                                              temperature=1.0))
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(session() for _ in range(sessions)))
    return summary(time.perf_counter() - start, latencies)


async def clients(url: str, tag: str, sessions: int, per: int, max_new: int, sdk: bool
                  ) -> dict[str, float]:
    """The gateway arm's load (in its own process: see ``--client``)."""
    import httpx

    body = {"model": "default", "messages": PROMPT, "temperature": 1.0, "max_tokens": max_new}
    latencies: list[float] = []

    async def session(i: int) -> None:
        # a client per coroutine, as an agent has: one shared by all scans its whole connection
        # pool on every request (the client then costs more than the gateway); verify=False:
        # plain HTTP, no SSL context to load
        async with httpx.AsyncClient(trust_env=False, verify=False, timeout=None) as http:
            for k in range(per):
                # a session (an episode) every TURNS calls: the tiny model's 64 positions hold
                # a few turns (an empty completion is continued by the same request again)
                base = f"{url}/sessions/{tag}-{i}-{k // TURNS}/v1"
                t = time.perf_counter()
                if sdk:
                    import openai

                    client = openai.AsyncOpenAI(base_url=base, api_key="-", http_client=http,
                                                max_retries=0)
                    await client.chat.completions.create(**body)
                else:
                    r = await http.post(f"{base}/chat/completions", json=body)
                    if r.status_code != 200:
                        raise RuntimeError(f"{r.status_code}: {r.text}")
                latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    return summary(time.perf_counter() - start, latencies)


def through_gateway(url: str, tag: str, sessions: int, per: int, max_new: int, sdk: bool
                    ) -> dict[str, float]:
    cmd = [sys.executable, "-m", "bench.gateway", "--client", url, tag, str(sessions),
           str(per), str(max_new), *(["--sdk"] if sdk else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the client process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def batch_counts(batcher: Any) -> tuple[int, int]:
    """(requests, batches) the engine has run so far; continuous: (rows, decoding steps)."""
    from astraflow.consumers.rollout.batcher import step_counts

    return step_counts(batcher.engine) or (batcher.requests, batcher.batches)


def mean_batch(batcher: Any, before: tuple[int, int]) -> float:
    """The engine's mean batch since :func:`batch_counts` gave ``before``."""
    rows, batches = batch_counts(batcher)
    return (rows - before[0]) / max(1, batches - before[1])


class Served:
    """A gateway over ``engine`` served on a thread; its sessions in memory, or on ``bus``."""

    def __init__(self, engine: Any, bus: Any = None) -> None:
        from astraflow.core.topics import run_topics
        from astraflow.gateway.app import create_app
        from astraflow.gateway.server import ServerThread
        from astraflow.gateway.service import Gateway
        from astraflow.gateway.store import SessionStore

        if bus is not None:
            bus.create_topics(run_topics("bench", ["default"]))
        store = SessionStore(bus, run="bench", max_open_sessions=1 << 20)
        self.gw = Gateway({"default": engine}, store, max_inflight=1 << 20)
        self.srv = ServerThread(create_app(self.gw)).start()

    def stop(self) -> None:
        self.srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, default=512,
                    help="requests per measurement (at least 8 per session)")
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--continuous", action="store_true",
                    help="the hf engine batches continuously (rollout.engine.continuous), in "
                         "both arms")
    ap.add_argument("--model", choices=sorted(SIZES), default="tiny",
                    help="the model's size (see the module's doc)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--record", choices=["memory", "bus"], nargs="+",
                    default=["memory", "bus"])
    ap.add_argument("--sdk", action="store_true", help="clients use the official openai SDK")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--client", nargs=5, metavar=("URL", "TAG", "SESSIONS", "PER", "MAX_NEW"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        url, tag, sessions, per, max_new = args.client
        print(json.dumps(asyncio.run(clients(url, tag, int(sessions), int(per), int(max_new),
                                             args.sdk))))
        return
    if args.quick:
        args.requests, args.repeats = 128, 1

    from astraflow.consumers.rollout.batcher import Batcher
    from astraflow.consumers.rollout.engines import build_engine
    from astraflow.core.bus import connect, embedded_url
    from astraflow.core.records import ChatMessage
    from astraflow.models.prompt import render_prompt

    with tempfile.TemporaryDirectory(prefix="af-bench-gateway-") as d:
        root = Path(d)
        model = tiny_model(root, name=f"{args.model}-arith", **SIZES[args.model])
        engine = build_engine("hf", model_path=model, threads=1,
                              max_batch_size=256, continuous=args.continuous)
        params = sum(p.numel() for p in engine.model.parameters()) / 1e6
        ids = render_prompt(engine.tokenizer, [ChatMessage(**m) for m in PROMPT])[1]
        bus = connect(embedded_url(Path(root) / "bus.db")) if "bus" in args.record else None
        served = {mode: Served(engine, bus if mode == "bus" else None) for mode in args.record}
        arms = ["direct", *(f"gateway ({m})" for m in args.record)]
        rows: dict[tuple[int, str], list[dict[str, float]]] = {}

        async def run_direct(sessions: int, per: int) -> dict[str, float]:
            batcher = Batcher(engine)
            try:
                before = batch_counts(batcher)
                out = await direct(batcher, ids, sessions, per, args.max_new_tokens)
                return {**out, "batch": mean_batch(batcher, before)}
            finally:
                await batcher.close()

        def via(mode: str, tag: str, sessions: int, per: int) -> dict[str, float]:
            batcher = served[mode].gw._batchers["default"]
            before = batch_counts(batcher)
            out = through_gateway(served[mode].srv.url, tag, sessions, per,
                                  args.max_new_tokens, args.sdk)
            return {**out, "batch": mean_batch(batcher, before)}

        def measure(rep: int) -> None:
            for c in args.sessions:
                per = max(8, args.requests // c)
                rows.setdefault((c, "direct"), []).append(
                    asyncio.run(run_direct(c, per)))
                for mode in args.record:
                    rows.setdefault((c, f"gateway ({mode})"), []).append(
                        via(mode, f"r{rep}-{c}", c, per))

        measure(-1)  # warm-up: first batches, imports, connections
        rows.clear()
        for rep in range(args.repeats):  # interleaved, so drifts hit every arm alike
            measure(rep)
        for s in served.values():
            s.stop()
        if bus is not None:
            bus.close()
        engine.close()

    print(f"# gateway bench: {args.model} arith model ({params:.1f}M parameters), hf engine "
          f"(1 thread{', continuous batching' if args.continuous else ''}), temperature 1, max "
          f"{args.max_new_tokens} new tokens, {args.requests} requests per measurement "
          f"(at least 8 per session), {'openai SDK' if args.sdk else 'httpx'} clients in a "
          f"process of their own, median of {args.repeats}\n")
    print("| sessions | arm | requests/s | p50 ms | p99 ms | mean batch | requests/s vs direct |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for c in args.sessions:
        base = statistics.median(r["rps"] for r in rows[(c, "direct")])
        for arm in arms:
            rs = rows[(c, arm)]
            rps = statistics.median(r["rps"] for r in rs)
            p50 = statistics.median(r["p50"] for r in rs)
            p99 = statistics.median(r["p99"] for r in rs)
            batch = statistics.median(r["batch"] for r in rs)
            print(f"| {c} | {arm} | {rps:,.0f} | {p50:.1f} | {p99:.1f} | {batch:.1f} | "
                  f"{rps / base:.2f} |")


if __name__ == "__main__":
    main()
