"""The gateway's memory under distinct large prompts it refuses: the process's RSS before and
after ``--prompts`` chat requests, each a distinct ``--size``-byte message over the model's
context (every one a 400 context_length_exceeded), sent over HTTP to a gateway served on a
thread of this process (the tiny ASCII model, built here; an embedded bus in a temporary
directory).

    python -m bench.gateway_memory                          # 1,000 prompts of 1 MiB
    python -m bench.gateway_memory --prompts 64 --size 65536 --clients 1

Printed: RSS before and after (and after a ``gc.collect()``), its growth per prompt, and what
the gateway's caches hold (the rendered-template cache, the store's sessions, closed ids,
locks and idempotency answers). A bounded gateway grows by about nothing per prompt; before
its caches were bounded, each 1 MiB prompt left ~8.6 MB behind. Nothing here gates CI.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.lib.models import tiny_model


def rss_mb() -> float:
    """This process's resident set size, MB (Linux: /proc/self/statm)."""
    import os

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def serve(root: Path, context: int) -> tuple[Any, Any, Any]:
    """(server, gateway, bus): the tiny model's hf engine behind a gateway on a free port."""
    from astraflow.consumers.rollout.engines import build_engine
    from astraflow.core.bus import connect
    from astraflow.core.topics import run_topics
    from astraflow.gateway.app import create_app
    from astraflow.gateway.server import ServerThread
    from astraflow.gateway.service import Gateway
    from astraflow.gateway.store import SessionStore
    model = tiny_model(root, "ascii", max_positions=context)
    engine = build_engine("hf", model_path=model, threads=1, seed=3)
    bus = connect(f"embedded://{root}/bus.db")
    bus.create_topics(run_topics("mem", ["default"]))
    gw = Gateway({"default": engine}, SessionStore(bus, run="mem"),
                 sampling={"max_new_tokens": 4})
    return ServerThread(create_app(gw)).start(), gw, bus


def held(gw: Any) -> dict[str, Any]:
    """What the gateway's caches hold (``n/a`` on a gateway from before they were bounded:
    the same script measures the code before the change)."""
    templates = getattr(gw, "templates", None)
    footprint = getattr(gw.store, "footprint", None)
    return {"template cache": templates.size() if templates is not None else "n/a",
            "store": footprint() if footprint is not None else "n/a"}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway_memory",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=1000, help="distinct refused prompts")
    ap.add_argument("--size", type=int, default=1 << 20, help="bytes of each prompt's message")
    ap.add_argument("--context", type=int, default=256, help="the model's positions")
    ap.add_argument("--clients", type=int, default=2,
                    help="requests at once (the gateway tokenizes 2 at a time)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srv, gw, bus = serve(Path(tmp), args.context)
        try:
            with httpx.Client(base_url=srv.url, timeout=600) as client:
                warm = {"messages": [{"role": "user", "content": "hi"}]}
                assert client.post("/v1/chat/completions", json=warm).status_code == 200
                gc.collect()
                before = rss_mb()
                start = time.monotonic()
                pad = "x" * (args.size - 64)  # within max_message_chars, role included

                def refuse(i: int) -> None:
                    body = {"messages": [{"role": "user", "content": f"{i:015d} {pad}"}]}
                    r = client.post("/v1/chat/completions", json=body)
                    code = r.json()["error"]["code"] if r.status_code == 400 else r.status_code
                    assert code == "context_length_exceeded", r.text[:300]
                    if (i + 1) % 100 == 0:
                        print(f"  {i + 1} prompts: rss {rss_mb():.0f} MB", flush=True)

                with ThreadPoolExecutor(args.clients) as pool:
                    list(pool.map(refuse, range(args.prompts)))
                elapsed = time.monotonic() - start
            after = rss_mb()
            gc.collect()
            collected = rss_mb()
            print(f"prompts {args.prompts} x {args.size} bytes, all refused (400), "
                  f"{elapsed:.0f} s")
            print(f"rss before {before:.0f} MB, after {after:.0f} MB, after gc {collected:.0f} "
                  f"MB: {(after - before) / args.prompts * 1e3:+.1f} kB per prompt")
            for name, what in held(gw).items():
                print(f"{name}: {what}")
        finally:
            srv.stop()
            bus.close()


if __name__ == "__main__":
    main()
