"""torch's CPU throughput on a real model, for choosing the trainer's micro-batch, the
worker's batch, the threads of each role and whether bf16 autocast pays on this CPU.

    python -m bench.cpu_throughput                       # SmolLM2-135M-Instruct (imported once)
    python -m bench.cpu_throughput --model PATH --threads 1 2 --train-tokens 1024 2048 4096

For each thread count and precision (fp32; bf16 autocast), it measures:

* **train**: one forward + backward of the causal-LM loss on a micro-batch of sequences of
  ``--seq-len`` tokens totalling each of ``--train-tokens``, then one AdamW step (the
  trainer's work per micro-batch; the step once per batch): tokens per second;
* **generate**: a batch of ``--gen-batch`` prompts of ``--prompt-len`` tokens, then
  ``--new-tokens`` sampled tokens with the KV cache (the hf engine's work): new tokens per
  second.

Each cell is the median of ``--reps`` runs after one warm-up run. bf16 autocast is also
checked for accuracy: the mean absolute difference of its per-token log-probabilities from
fp32's on the same batch. Results go to ``<out>/cpu_throughput.json`` and a table; the last
line gives the best settings. One invocation on one machine is one sample.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from astraflow.core.cores import machine_cores

ROOT = Path(__file__).resolve().parents[1]


def _model(path: str) -> tuple[Any, int]:
    from transformers import AutoModelForCausalLM

    from astraflow.models.source import resolve

    folder = resolve(path, key="--model", progress=lambda m: print(m, file=sys.stderr))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 use_safetensors=True)
    return model, int(model.config.vocab_size)


def _autocast(precision: str) -> Any:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _median_time(fn: Any, reps: int) -> float:
    fn()  # warm-up: allocator, OpenMP team, oneDNN kernels
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_cell(model: Any, vocab: int, tokens: int, seq_len: int, precision: str,
               reps: int) -> float:
    """Tokens per second of forward + backward + one AdamW step on ``tokens`` tokens."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (max(1, tokens // seq_len), seq_len), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: the model stays as it is

    def one() -> None:
        with _autocast(precision):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return ids.numel() / _median_time(one, reps)


def gen_cell(model: Any, vocab: int, batch: int, prompt_len: int, new_tokens: int,
             precision: str, reps: int) -> float:
    """New tokens per second of a sampled, KV-cached decode of ``batch`` prompts."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=g)

    def one() -> None:
        with torch.inference_mode(), _autocast(precision):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=True, temperature=1.0, top_k=0, pad_token_id=0)

    return batch * new_tokens / _median_time(one, reps)


def bf16_logprob_error(model: Any, vocab: int, seq_len: int) -> float:
    """Mean |log p_bf16 − log p_fp32| of the sampled-next-token log-probabilities."""
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, vocab, (8, seq_len), generator=g)
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
        with _autocast("bf16"):
            low = torch.log_softmax(model(input_ids=ids).logits.float(), -1)
    pick = ids[:, 1:, None]
    a = ref[:, :-1].gather(-1, pick)
    b = low[:, :-1].gather(-1, pick)
    return float((a - b).abs().mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_throughput",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"],
                    choices=["fp32", "bf16"])
    ap.add_argument("--train-tokens", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--gen-batch", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-cpu-throughput")
    args = ap.parse_args(argv)
    model, vocab = _model(args.model)
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for precision in args.precision:
            for tokens in args.train_tokens:
                model.train(False)
                tps = train_cell(model, vocab, tokens, args.seq_len, precision, args.reps)
                rows.append({"kind": "train", "threads": threads, "precision": precision,
                             "size": tokens, "tokens_per_s": tps})
                print(f"train    threads={threads} {precision} tokens={tokens:5d}: "
                      f"{tps:8.1f} tokens/s", flush=True)
            for batch in args.gen_batch:
                tps = gen_cell(model, vocab, batch, args.prompt_len, args.new_tokens,
                               precision, args.reps)
                rows.append({"kind": "generate", "threads": threads, "precision": precision,
                             "size": batch, "tokens_per_s": tps})
                print(f"generate threads={threads} {precision} batch={batch:5d}: "
                      f"{tps:8.1f} new tokens/s", flush=True)
    err = bf16_logprob_error(model, vocab, args.seq_len) if "bf16" in args.precision else None
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "rows": rows, "bf16_logprob_abs_err": err,
              "torch": torch.__version__, "cores": machine_cores()}
    (args.out / "cpu_throughput.json").write_text(json.dumps(result, indent=2))
    for kind in ("train", "generate"):
        best = max((r for r in rows if r["kind"] == kind), key=lambda r: r["tokens_per_s"])
        base = [r for r in rows if r["kind"] == kind and r["threads"] == best["threads"]
                and r["size"] == best["size"] and r["precision"] == "fp32"]
        vs = (f" ({best['tokens_per_s'] / base[0]['tokens_per_s']:.2f}x fp32)"
              if base and best["precision"] != "fp32" else "")
        print(f"best {kind}: threads={best['threads']} {best['precision']} "
              f"size={best['size']} {best['tokens_per_s']:.1f} tokens/s{vs}")
    if err is not None:
        print(f"bf16 autocast: mean |Δ log p| = {err:.4f} nats per token against fp32")
    print(f"wrote {args.out / 'cpu_throughput.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
