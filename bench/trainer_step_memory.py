"""The trainer's real step on a real model, per micro-batch size: seconds and peak memory of
``rl_step`` on a SmolLM2-sized batch (8 groups × 8 sequences of 50 prompt + 12 completion
tokens, random ids, a third of the rewards 1), the config's trainer settings (bf16 autocast in
the SmolLM2 examples) and threads. Each size runs in a process of its own, so that each peak
RSS is its own.

    python -m bench.trainer_step_memory                                  # 1,024 and 2,048
    python -m bench.trainer_step_memory --config examples/smollm2_chain_sum.yaml --tokens 4096

Measured once here (2 cores, 1 thread, examples/smollm2_solver_verifier.yaml's trainer): 14.6 s
a step and 6.8 GB peak RSS at 2,048-token micro-batches, 13.8 s and 5.3 GB at 1,024. One
invocation on one machine is one sample.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(config: Path, policy: str, tokens: int, steps: int, threads: int) -> dict[str, float]:
    """``steps`` steps at ``tokens`` per micro-batch in this process: the last step's seconds
    and the peak RSS (GB)."""
    import torch

    from astraflow.config import load_experiment
    from astraflow.consumers.trainer.build import build_train_state
    from astraflow.consumers.trainer.rl import rl_step
    from astraflow.core.records import Batch, Group, Trajectory, pack_f32, pack_i32, pack_u8
    from astraflow.run.resources import model_dir

    cfg = load_experiment(config, [f"trainer.micro_batch_tokens={tokens}"])
    state = build_train_state(cfg.trainer_for(policy), model_dir(cfg, policy, ROOT / "runs" /
                                                               "trainer-step-memory"))
    torch.set_num_threads(threads)
    rng = random.Random(0)

    def trajectory(g: int, j: int) -> Trajectory:
        k, n = 50, 12
        ids = [rng.randrange(1000, 40000) for _ in range(k + n)]
        return Trajectory(id=f"{g}/{j}", task_id=str(g), group_id=str(g), sample_index=j,
                          group_size=8, token_ids=pack_i32(ids),
                          loss_mask=pack_u8([0] * k + [1] * n),
                          logprobs=pack_f32([0.0] * k + [-2.0] * n),
                          versions=pack_i32([-1] * k + [0] * n), prompt_len=k,
                          reward=float(rng.random() < 0.3))

    seconds = 0.0
    for s in range(steps):
        groups = [Group(group_id=str(g), task_id=str(g),
                        trajectories=[trajectory(g, j) for j in range(8)]) for g in range(8)]
        t0 = time.perf_counter()
        rl_step(state, Batch(id=str(s), policy=policy, seq=s, groups=groups), s)
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"tokens": tokens, "step_s": round(seconds, 2), "peak_rss_gb": round(peak, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.trainer_step_memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path,
                    default=ROOT / "examples" / "smollm2_solver_verifier.yaml")
    ap.add_argument("--policy", default=None, help="default: the config's first policy")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.policy is None:
        from astraflow.config import load_experiment

        args.policy = load_experiment(args.config).policies[0]
    if args.one is not None:  # a child: one size, its result on stdout
        print(json.dumps(one(args.config, args.policy, args.one, args.steps, args.threads)))
        return 0
    print("| micro-batch tokens | step (s) | peak RSS (GB) |\n|---|---|---|")
    for tokens in args.tokens:
        out = subprocess.run(
            [sys.executable, "-m", "bench.trainer_step_memory", "--config", str(args.config),
             "--policy", args.policy, "--steps", str(args.steps), "--threads", str(args.threads),
             "--one", str(tokens)],
            capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {r['tokens']} | {r['step_s']} | {r['peak_rss_gb']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
