"""The sharded trainer against one process: ``python -m bench.trainer --parallel fsdp --ranks 2``.

Both runs train the same quickstart-sized RL batches (64 prompts × 8 samples, see
``bench/trainer.py``'s ``quickstart_batch``) from the same tiny Qwen2 model (``--hidden``,
``--layers``: the quickstart's is 128 × 2); the N ranks run as ``astraflow run`` starts them
(a gang, :mod:`astraflow.core.gang`, gloo on CPU). Measured per run, by rank 0:

- step time: the mean of ``--steps`` steps after 2 untimed ones (the ratio N ranks / 1);
- the first step's loss and grad norm (equal within rounding: the equality tests' claim);
- rank 0's peak RSS (``ru_maxrss``: the whole process — Python, torch, the batch — not only
  the model) and the bytes of model state it holds: its parameter shards × 4 bytes × 4
  (fp32 weights, gradients, AdamW's two moments).

On CPU the ranks share the machine's cores, so N ranks are not expected to be faster here;
the point is the per-rank state (1/N) and that nothing else grows. Nothing gates CI.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib.models import tiny_model


def rank_main(model_dir: str, parallel: str, steps: int, out: str) -> None:
    """One rank: build the train state, train, write rank 0's measurements to ``out``."""
    import torch

    from astraflow.consumers.trainer.build import build_train_state
    from astraflow.consumers.trainer.config import TrainerConfig
    from astraflow.consumers.trainer.rl import rl_step
    from astraflow.consumers.trainer.sharding import local_numel
    from bench.trainer import quickstart_batch

    tc = TrainerConfig.model_validate({"parallel": parallel, "optimizer": {"lr": 1e-3},
                                       "micro_batch_tokens": 1024, "threads": 1})
    state = build_train_state(tc, model_dir)
    rss_built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, first = [], {}
    for k in range(steps + 2):
        started = time.perf_counter()
        m = rl_step(state, quickstart_batch(k, zero_share=0.0), k)
        if k == 0:
            first = {"loss": m["loss"], "grad_norm": m["grad_norm"]}
        if k >= 2:
            times.append(time.perf_counter() - started)
    if state.rank == 0:
        Path(out).write_text(json.dumps({
            "world": state.world, "step_s": sum(times) / len(times), **first,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_after_build_mb": rss_built / 1024,
            "state_mb": local_numel(state.model) * 4 * 4 / 2**20,
            "params": sum(p.numel() for p in state.model.parameters()) if state.world == 1
            else None, "torch_threads": torch.get_num_threads()}))


def run(model_dir: Path, parallel: str, ranks: int, steps: int, tmp: Path) -> dict[str, Any]:
    from astraflow.core.gang import gang_argv

    out = tmp / f"{parallel}-{ranks}.json"
    argv = [sys.executable, "-m", "bench.trainer_parallel", "--rank", str(model_dir), parallel,
            str(steps), str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run(gang_argv(ranks, argv) if ranks > 1 else argv, check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    return json.loads(out.read_text())


def compare(parallel: str, ranks: int, *, steps: int, hidden: int, layers: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model_dir = tiny_model(tmp, name="model", hidden=hidden, layers=layers,
                               intermediate=4 * hidden)
        one = run(model_dir, "ddp", 1, steps, tmp)
        many = run(model_dir, parallel, ranks, steps, tmp)
    print(f"## {parallel} × {ranks} ranks vs 1 process — tiny Qwen2 {hidden}×{layers} "
          f"({one['params'] / 1e6:.2f}M params), {steps} timed steps of 512 trajectories\n")
    print("| | 1 process | " + f"{parallel} × {ranks} | ratio |\n|---|---|---|---|")
    for key, label in (("step_s", "step time (s)"), ("state_mb", "rank-0 model state (MB)"),
                       ("peak_rss_mb", "rank-0 peak RSS (MB)"),
                       ("rss_after_build_mb", "rank-0 RSS after build (MB)")):
        print(f"| {label} | {one[key]:.3f} | {many[key]:.3f} | {many[key] / one[key]:.2f} |")
    print(f"| first step loss | {one['loss']:.6f} | {many['loss']:.6f} | |")
    print(f"| first step grad norm | {one['grad_norm']:.6f} | {many['grad_norm']:.6f} | |")


if __name__ == "__main__" and sys.argv[1:2] == ["--rank"]:
    rank_main(*sys.argv[2:4], int(sys.argv[4]), sys.argv[5])
