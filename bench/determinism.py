"""What a reproducible trainer costs on CPU (`astraflow replay` needs one; docs/trainer.md#replay).

    python -m bench.determinism               # ~1 minute on 2 cores
    python -m bench.determinism --steps 10 --repeats 1

Quickstart-sized RL steps (64 prompts × 8 samples on the tiny model, bench/trainer.py's batches)
from the same start on the same batches, in three arms, interleaved: ``trainer.threads: 1``
(what the examples set), ``threads: 1`` with ``trainer.deterministic: true``
(torch.use_deterministic_algorithms), and ``threads`` = every core of the machine. Per arm: steps
per second (median of the repeats) against ``threads: 1``, whether two repeats of the arm end
with bit-identical weights, and whether the arm's weights equal the ``threads: 1`` arm's.

Prints markdown; nothing here gates CI.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from astraflow.consumers.trainer.build import build_train_state
from astraflow.consumers.trainer.config import TrainerConfig
from astraflow.consumers.trainer.rl import rl_step
from astraflow.core.cores import machine_cores
from bench.lib.models import tiny_model
from bench.trainer import quickstart_batch


def run_arm(model_dir: Path, batches: list, threads: int, deterministic: bool
            ) -> tuple[float, dict[str, torch.Tensor]]:
    """Steps per second and the final weights of ``len(batches)`` steps."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    try:
        state = build_train_state(TrainerConfig.model_validate(
            {"device": "cpu", "threads": threads, "deterministic": deterministic}), model_dir)
        t0 = time.perf_counter()
        for v, batch in enumerate(batches):
            rl_step(state, batch, v)
        rate = len(batches) / (time.perf_counter() - t0)
        return rate, {k: t.detach().clone() for k, t in state.model.state_dict().items()}
    finally:
        torch.use_deterministic_algorithms(False)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.determinism",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cores = machine_cores()
    arms = [("threads 1 (the examples)", 1, False),
            ("threads 1 + deterministic", 1, True),
            (f"threads {cores} (every core)", cores, False)]
    batches = [quickstart_batch(k) for k in range(args.steps)]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(Path(tmp), name="model")
        rates: dict[str, list[float]] = {name: [] for name, *_ in arms}
        finals: dict[str, list[dict[str, torch.Tensor]]] = {name: [] for name, *_ in arms}
        for _ in range(max(2, args.repeats)):
            for name, threads, det in arms:
                rate, final = run_arm(model_dir, batches, threads, det)
                rates[name].append(rate)
                finals[name].append(final)
    base = statistics.median(rates[arms[0][0]])
    print(f"{args.steps} RL steps of 64 × 8 on the tiny model, {max(2, args.repeats)} repeats "
          f"interleaved, {cores} cores, torch {torch.__version__}\n")
    print("| arm | steps/s (median) | vs threads 1 | repeats bit-identical | equals threads 1 |")
    print("|---|---|---|---|---|")
    ref = finals[arms[0][0]][0]
    for name, *_ in arms:
        r = statistics.median(rates[name])
        runs = finals[name]
        print(f"| {name} | {r:.2f} | {r / base:.2f}x | "
              f"{'yes' if all(same(runs[0], x) for x in runs[1:]) else 'no'} | "
              f"{'yes' if same(ref, runs[0]) else 'no'} |")


if __name__ == "__main__":
    main()
