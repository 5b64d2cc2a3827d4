"""Rollout memory of N policies of one base: N LoRA adapters in one engine
(``rollout.engine.adapters``) against N engines each holding the model (what a worker hosting
N full-model policies holds).

Each measurement runs in a fresh process: the resident set after the imports is the
baseline, then the engines are built, every policy receives an adapter version (random
LoRA matrices of rank ``--rank`` on q/k/v/o, what a LoRA trainer publishes) and answers one
batch of ``--batch`` requests, and the growth of the resident set is reported (peak and
after). One sample per cell on this machine.

    python -m bench.adapter_memory                       # SmolLM2-135M, N = 1, 2, 4
    python -m bench.adapter_memory --model tiny --n 1 2   # the tiny model (seconds)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.lib.models import tiny_model

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def _rss_mb() -> tuple[float, float]:
    """(current, peak) resident set of this process, MB."""
    cur = peak = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            cur = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return cur, peak


def _model_path(name: str) -> Path:
    if name == "tiny":
        import tempfile

        return tiny_model(Path(tempfile.mkdtemp()), name="tiny")
    from astraflow.models.source import resolve

    return Path(resolve(name))


def measure(model: str, n: int, mode: str, rank: int, batch: int) -> dict[str, float]:
    """One cell, in this process (see the module docstring)."""
    import torch

    from astraflow.consumers.rollout.engines.adapters import adapter_views
    from astraflow.consumers.rollout.engines.base import GenRequest
    from astraflow.consumers.rollout.engines.hf import HFEngine
    from astraflow.core.records import AdapterSpec

    torch.set_num_threads(1)
    path = _model_path(model)
    import transformers  # noqa: F401 - the imports are part of the baseline

    base_mb, _ = _rss_mb()
    policies = [f"p{i}" for i in range(n)]
    spec = AdapterSpec(r=rank, alpha=2.0 * rank, target_modules=list(MODULES),
                       base_model=str(path))
    if mode == "adapters":
        engine = HFEngine(path, adapters=policies, max_batch_size=batch)
        engines = dict(adapter_views(engine, policies))
    else:
        engines = {p: HFEngine(path, max_batch_size=batch) for p in policies}
    for i, view in enumerate(engines.values()):
        if mode != "adapters":
            continue
        g = torch.Generator().manual_seed(i)
        target = view.weight_target()
        model_ = engine.model
        tensors = {}
        for name, mod in model_.named_modules():
            if name.rsplit(".", 1)[-1] in MODULES and hasattr(mod, "weight"):
                w = mod.weight
                pre = f"base_model.model.{name.removesuffix('.base')}"
                tensors[f"{pre}.lora_A.weight"] = torch.randn(rank, w.shape[1], generator=g)
                tensors[f"{pre}.lora_B.weight"] = torch.randn(w.shape[0], rank, generator=g)

        def apply(target=target, tensors=tensors) -> None:  # type: ignore[no-untyped-def]
            for name, t in tensors.items():
                target.apply(name, "bfloat16", tuple(t.shape),
                             t.to(torch.bfloat16).view(torch.int16).numpy().reshape(-1))
            target.set_adapter(spec)
            target.commit(1)

        view.update_weights(apply)
    tok = next(iter(engines.values())).tokenizer
    prompt = tok("17+25=").input_ids  # the tiny model reads digits and signs only
    per = max(1, batch // n)
    if mode == "adapters":
        reqs = [GenRequest(prompt, max_new_tokens=16, adapter=p) for p in policies
                for _ in range(per)]
        engine.generate(reqs)
    else:
        for e in engines.values():
            e.generate([GenRequest(prompt, max_new_tokens=16) for _ in range(per)])
    cur, peak = _rss_mb()
    return {"n": n, "mode": mode, "after_mb": round(cur - base_mb, 1),
            "peak_mb": round(peak - base_mb, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.adapter_memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="a model path, hub id or shortcut; tiny: the tiny model")
    ap.add_argument("--n", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16, help="requests of the one batch")
    ap.add_argument("--cell", help=argparse.SUPPRESS)  # internal: one cell, as JSON
    args = ap.parse_args()
    if args.cell:
        mode, n = args.cell.split(":")
        print(json.dumps(measure(args.model, int(n), mode, args.rank, args.batch)))
        return
    rows = []
    for n in args.n:
        for mode in ("adapters", "full"):
            out = subprocess.run([sys.executable, "-m", "bench.adapter_memory",
                                  "--model", args.model,
                                  "--rank", str(args.rank), "--batch", str(args.batch),
                                  "--cell", f"{mode}:{n}"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    print("\n| N | adapters in one engine: MB after / peak | N engines: MB after / peak | ratio |")
    print("|---:|---:|---:|---:|")
    for n in args.n:
        a = next(r for r in rows if r["n"] == n and r["mode"] == "adapters")
        f = next(r for r in rows if r["n"] == n and r["mode"] == "full")
        print(f"| {n} | {a['after_mb']:,.0f} / {a['peak_mb']:,.0f} | "
              f"{f['after_mb']:,.0f} / {f['peak_mb']:,.0f} | "
              f"{a['after_mb'] / max(f['after_mb'], 1e-9):.2f} |")


if __name__ == "__main__":
    main()
