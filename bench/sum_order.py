"""Does a tiny model learn a sum faster written least-significant digit first?
(docs/results/several-models.md)

A verifier that checks "a+b=c" by recomputing the sum could write its work in the order a
left-to-right decoder carries (units first: "12+39=" -> "15"), and so check faster than a
solver, which must answer most-significant digit first ("51"), can solve. This measures it:
the team-alphabet tiny model (the solver_verifier example's shape, same seed) trained by plain
SFT on ``a+b=`` for a, b in 0..99, once per digit order, with greedy held-out accuracy every
--every steps (300 problems never trained on).

    python -m bench.sum_order                       # both orders, 600 steps each (~3 min)
    python -m bench.sum_order --orders lsb --steps 1000 --seed 1

One process, one thread (``--threads``); the two orders run one after the other from the same
initial weights and the same stream of problems.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Iterator
from typing import Any

ORDERS = ("msb", "lsb", "columns")


def target(a: int, b: int, order: str) -> str:
    """The text to write: ``msb`` the sum as written ("51"), ``lsb`` units first ("15"),
    ``columns`` the column sums, units first, then the sum ("2+9=11\n1+3+1=5\n51": the work a
    verifier shows before it judges with ``launch.warmup.verifier_work: columns``)."""
    s = str(a + b)
    if order == "lsb":
        return s[::-1]
    if order == "columns":
        from astraflow.producers.claims import work_text

        return work_text(f"{a}+{b}=", s, "columns").rstrip("\n")
    return s


def answer_of(text: str) -> str:
    """The sum a model wrote: the last line of its text."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def split(seed: int, n_test: int = 300) -> tuple[list[tuple[int, int]], Iterator[tuple[int, int]]]:
    """``n_test`` held-out problems and an endless stream of training problems outside them."""
    rng = random.Random(seed)
    test = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n_test)]
    held = set(test)

    def stream() -> Iterator[tuple[int, int]]:
        while True:
            p = (rng.randint(0, 99), rng.randint(0, 99))
            if p not in held:
                yield p
    return test, stream()


def batch(tok: Any, problems: list[tuple[int, int]], order: str) -> tuple[Any, Any, Any]:
    """Left-padded ids, attention mask and labels (the answer and ``<eos>`` only)."""
    import torch

    seqs = []
    for a, b in problems:
        prompt = tok.encode(f"{a}+{b}=")
        answer = tok.convert_tokens_to_ids(list(target(a, b, order))) + [tok.eos_token_id]
        seqs.append((prompt, answer))
    width = max(len(p) + len(t) for p, t in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100)
    for i, (p, t) in enumerate(seqs):
        off = width - len(p) - len(t)
        ids[i, off:] = torch.tensor(p + t)
        mask[i, off:] = 1
        labels[i, off + len(p):] = torch.tensor(t)
    return ids, mask, labels


def accuracy(model: Any, tok: Any, test: list[tuple[int, int]], order: str) -> float:
    """Greedy held-out accuracy, generated as the project's evaluator generates (left-padded,
    100 problems a batch): the last line written against the sum's."""
    from astraflow.consumers.evaluator import greedy_texts
    from astraflow.core.records import ChatMessage
    from astraflow.producers.sources import TaskSpec

    specs = [TaskSpec(id=f"{a}+{b}", prompt=[ChatMessage(role="user", content=f"{a}+{b}=")],
                      reference={}) for a, b in test]
    model.eval()
    texts = greedy_texts(model, tok, specs, max_new_tokens=len(target(99, 99, order)) + 1,
                         batch_size=100)
    model.train()
    right = sum(answer_of(t) == answer_of(target(a, b, order))
                for (a, b), t in zip(test, texts, strict=True))
    return right / len(test)


def train(order: str, *, steps: int, every: int, batch_size: int, lr: float,
          seed: int) -> list[dict[str, float]]:
    """SFT one fresh model on one digit order; the accuracy curve."""
    import torch

    from astraflow.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer("team")
    model = build_model(tok, seed=seed)
    test, stream = split(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    curve, t0 = [], time.perf_counter()
    for step in range(1, steps + 1):
        ids, mask, labels = batch(tok, [next(stream) for _ in range(batch_size)], order)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0 or step == steps:
            point = {"step": step, "loss": round(loss.item(), 4),
                     "accuracy": round(accuracy(model, tok, test, order), 4),
                     "seconds": round(time.perf_counter() - t0, 1)}
            curve.append(point)
            print(json.dumps({"order": order, **point}), flush=True)
    return curve


def first_reaching(curve: list[dict[str, float]], level: float) -> int | None:
    return next((int(p["step"]) for p in curve if p["accuracy"] >= level), None)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sum_order",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--orders", nargs="+", choices=ORDERS, default=list(ORDERS))
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    curves = {o: train(o, steps=args.steps, every=args.every, batch_size=args.batch_size,
                       lr=args.lr, seed=args.seed) for o in args.orders}
    print("\n| order | " + " | ".join(f"step {p['step']}" for p in curves[args.orders[0]])
          + " | first ≥ 0.5 |")
    print("|---|" + "---|" * (len(curves[args.orders[0]]) + 1))
    for order, curve in curves.items():
        print(f"| {order} | " + " | ".join(f"{p['accuracy']:.3f}" for p in curve)
              + f" | {first_reaching(curve, 0.5) or '—'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
