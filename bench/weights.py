"""Weight deltas: how sparse real bf16 updates are, and what the codec makes of them.

    python -m bench.weights            # all three parts, a few minutes on 2 cores
    python -m bench.weights --quick    # smaller model and tensor set, well under a minute

1. **Sparsity on real training.** A causal LM built here (pure torch, ~29M parameters, untied
   embeddings; 14% of the parameters are embedding and head, as in Qwen3 1.7B–14B's 10–18%) is
   first trained briefly at lr 2e-3 on a synthetic language (a random sparse bigram process with
   Zipf token frequencies), standing in for a pretrained model. Then, for each lr, a fresh AdamW
   (fp32 master weights, betas 0.9/0.999, no weight decay) starts from that checkpoint, as RL
   fine-tuning does, and every step is published as bf16 (round to nearest even, as
   ``tensor.to(torch.bfloat16)``). Reported: the fraction of bf16 values equal to the previous
   step's, and the size of our delta for that step against dense bf16.
2. **Size and speed** of the codec on a ≥100M-parameter synthetic bf16 set at 98.9% and 97.8%
   unchanged (see :mod:`astraflow.weights.bench`), against dense bf16, dense + zstd, the
   uint32-index + value format, and the entropy floor; encode and decode + apply + verify
   throughput on one core.
3. **Why these encodings**: bits per changed value for the alternatives that were measured.

Prints markdown tables; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import numpy as np
import zstandard

from astraflow.weights import bench as wbench
from astraflow.weights.blob import encode_version
from astraflow.weights.codec import pack_bits, to_planes, zigzag

PAPER = {1e-6: "≥ 0.996", 3e-6: "0.989–0.993", 5e-6: "≈ 0.978", 1e-5: "—"}


# ----------------------------------------------------------------------------- part 1: model

def build_model(vocab: int, dim: int, layers: int, heads: int, seq: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim, bias=False)
            self.proj = nn.Linear(dim, dim, bias=False)
            self.up = nn.Linear(dim, 4 * dim, bias=False)
            self.down = nn.Linear(4 * dim, dim, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, t, 3, heads, dim // heads).unbind(2)
            a = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, dim))
            return x + self.down(nn.functional.gelu(self.up(self.n2(x))))

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(seq, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids) + self.pos.weight[: ids.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    return LM()


class Bigrams:
    """A random sparse bigram language with Zipf-distributed token frequencies: each token is
    followed by one of 8 successors, so frequent tokens are learnt in a few dozen steps and rare
    ones rarely get a gradient (as most of a real vocabulary does in an RL batch)."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        zipf = 1.0 / np.arange(1, vocab + 1)
        zipf /= zipf.sum()
        self.vocab = vocab
        self.next = rng.choice(vocab, size=(vocab, 8), p=zipf)
        self.p = rng.dirichlet(np.ones(8) * 0.5, vocab)
        self.start = zipf
        self.rng = rng

    def batch(self, b: int, t: int):  # type: ignore[no-untyped-def]
        import torch

        ids = np.empty((b, t + 1), np.int64)
        ids[:, 0] = self.rng.choice(self.vocab, size=b, p=self.start)
        for j in range(1, t + 1):
            prev = ids[:, j - 1]
            choice = (self.rng.random(b)[:, None] > np.cumsum(self.p[prev], 1)).sum(1)
            ids[:, j] = self.next[prev, np.minimum(choice, 7)]
        return torch.from_numpy(ids)


def bf16_bits(model) -> dict[str, tuple[str, np.ndarray]]:  # type: ignore[no-untyped-def]
    import torch

    return {n: ("bfloat16", p.detach().to(torch.bfloat16).view(torch.int16).numpy()
                .view(np.uint16).copy()) for n, p in model.named_parameters()}


def sparsity(args: argparse.Namespace) -> str:
    import torch

    torch.manual_seed(0)
    vocab, dim, layers, seq, batch = ((2048, 192, 2, 64, 8) if args.quick
                                      else (4096, 512, 8, 64, 8))
    model = build_model(vocab, dim, layers, heads=8, seq=seq)
    n_params = sum(p.numel() for p in model.parameters())
    lang = Bigrams(vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    t0 = time.perf_counter()

    def step(o) -> float:  # type: ignore[no-untyped-def]
        ids = lang.batch(batch, seq)
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        o.zero_grad(set_to_none=True)
        loss.backward()
        o.step()
        return float(loss.detach())

    losses = [step(opt) for _ in range(args.pretrain_steps)]
    print(f"# part 1: {n_params / 1e6:.1f}M-parameter LM, pretrained {args.pretrain_steps} steps "
          f"at lr 2e-3 (loss {losses[0]:.2f} → {losses[-1]:.2f}, "
          f"{time.perf_counter() - t0:.0f} s); {args.steps} steps per lr\n", file=sys.stderr)
    checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
    tail = min(5, args.steps - 1)
    rows = [f"| lr | step 1 | steps 2–{args.steps} (mean) | last {tail} steps (mean) "
            f"| non-embedding, last {tail} | our delta / dense bf16, last {tail} "
            "| paper (Qwen3 1.7B–14B) |", "|---|---|---|---|---|---|---|"]
    for lr in (1e-6, 3e-6, 5e-6, 1e-5):
        model.load_state_dict(checkpoint)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        prev = bf16_bits(model)
        fracs, body, ratios = [], [], []
        inner = [k for k in prev if not k.startswith(("embed", "head", "pos"))]
        for v in range(1, args.steps + 1):
            step(opt)
            cur = bf16_bits(model)
            same = {k: int(np.count_nonzero(prev[k][1] == cur[k][1])) for k in cur}
            fracs.append(sum(same.values()) / n_params)
            body.append(sum(same[k] for k in inner) / sum(cur[k][1].size for k in inner))
            enc = encode_version(cur, version=v, base=prev, base_version=v - 1)
            ratios.append(len(enc.blob) / (2 * n_params))
            prev = cur
        last = float(np.mean(ratios[-tail:]))
        rows.append(f"| {lr:.0e} | {fracs[0]:.4f} | {np.mean(fracs[1:]):.4f} "
                    f"| {np.mean(fracs[-tail:]):.4f} | {np.mean(body[-tail:]):.4f} "
                    f"| {last:.2%} (1/{1 / last:.0f}) | {PAPER[lr]} |")
        print(f"# lr {lr:.0e} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return "\n".join(rows)


# ----------------------------------------------------------------------------- part 3

def alternatives(n: int = 20_000_000, unchanged: float = 0.989) -> str:
    """Bits per changed value of each candidate stream encoding (zstd on one core)."""
    base = wbench.synthetic_model(n)
    new, _ = wbench.step(base, unchanged, 1)
    a = np.concatenate([b.reshape(-1) for _d, b in base.values()])
    b = np.concatenate([b.reshape(-1) for _d, b in new.values()])
    idx = np.flatnonzero(a != b)
    k = len(idx)
    gaps = (np.diff(idx, prepend=-1) - 1).astype(np.uint32)
    sub = zigzag(b[idx] - a[idx])

    def varint(g: np.ndarray) -> bytes:
        out = bytearray()
        for x in g.tolist():  # reference implementation; speed is not measured here
            while x >= 0x80:
                out.append(x & 0x7F | 0x80)
                x >>= 7
            out.append(x)
        return bytes(out)

    code = sub - np.uint16(1)
    escaped = code[code >= 3] - np.uint16(3)
    streams = {
        "positions: uint32 gaps, raw": [gaps.tobytes()],
        "positions: LEB128 varint gaps": [varint(gaps)],
        "positions: gap byte planes": [to_planes(gaps, 2).tobytes()],
        "positions: low 4 bits packed + byte planes of the rest (chosen)":
            [pack_bits((gaps & 15).astype(np.uint8), 4).tobytes(),
             to_planes(gaps >> 4, 1).tobytes()],
        "values: raw bf16 bits": [b[idx].tobytes()],
        "values: XOR with base, byte planes": [to_planes(a[idx] ^ b[idx], 2).tobytes()],
        "values: difference to base, little-endian": [(b[idx] - a[idx]).tobytes()],
        "values: zigzag difference, byte planes": [to_planes(sub, 1).tobytes()],
        "values: zigzag codes as 2-bit symbols + escapes (chosen)":
            [pack_bits(np.minimum(code, 3).astype(np.uint8), 2).tobytes(),
             to_planes(escaped, 1).tobytes()],
    }
    rows = ["| stream | zstd -1 | zstd -3 | zstd -9 | zstd -19 |", "|---|---|---|---|---|"]
    for name, parts in streams.items():
        cells = []
        for level in (1, 3, 9, 19):
            t = time.perf_counter()
            cctx = zstandard.ZstdCompressor(level=level, threads=0)
            size = sum(len(cctx.compress(data)) for data in parts)  # a block each, as the codec
            ms = (time.perf_counter() - t) * 1e3
            cells.append(f"{8 * size / k:.2f} b ({ms:.0f} ms)")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    p = k / a.size
    floor = -(p * math.log2(p) + (1 - p) * math.log2(1 - p)) / p
    _vals, counts = np.unique(sub, return_counts=True)
    rows.append(f"| entropy floor: positions {floor:.2f} b, values "
                f"{wbench.entropy_bits(counts):.2f} b | | | | |")
    return (f"{k:,} changed of {a.size:,} bf16 values ({1 - p:.3f} unchanged); bits per "
            "changed value (compress time)\n\n" + "\n".join(rows))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.weights",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    ap.add_argument("--params", type=int, default=None, help="part 2 size (default 100M)")
    ap.add_argument("--steps", type=int, default=None, help="part 1 steps per lr")
    ap.add_argument("--pretrain-steps", type=int, default=None)
    ap.add_argument("--parts", default="1,2,3")
    args = ap.parse_args()
    args.steps = args.steps or (6 if args.quick else 20)
    args.pretrain_steps = args.pretrain_steps or (20 if args.quick else 40)
    params = args.params or (5_000_000 if args.quick else 100_000_000)
    parts = {int(p) for p in args.parts.split(",")}
    cmd = "python -m bench.weights " + " ".join(sys.argv[1:])
    print(f"<!-- {cmd.strip()} -->")
    if 1 in parts:
        print("\n## 1. Fraction of bf16 values unchanged per AdamW step\n")
        print(sparsity(args))
    if 2 in parts:
        print(f"\n## 2. Codec size and one-core speed ({params / 1e6:.0f}M-parameter bf16 set)\n")
        print(wbench.table(wbench.run(params, (0.989, 0.978))))
    if 3 in parts:
        print("\n## 3. Encodings measured\n")
        print(alternatives(2_000_000 if args.quick else 20_000_000))


if __name__ == "__main__":
    main()
