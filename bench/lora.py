"""LoRA against full fine-tuning: bytes per published version, step time, and learning.

    python -m bench.lora bytes                       # tiny quickstart model + SmolLM2-135M
    python -m bench.lora bytes --models tiny         # the tiny model only (seconds)
    python -m bench.lora learn runs/quickstart       # a run dir whose SFT warm-up ended
    astraflow run examples/quickstart.yaml --warmup-only --out runs/quickstart   # makes one

1. **Bytes per published version.** For each model, a full fine-tuning trainer and a LoRA
   trainer (``trainer.lora``) take the same RL steps on the same random batches; every
   version goes through the real :class:`~astraflow.weights.publisher.Publisher` (bf16 on the
   wire, sparse deltas against the previous version). Reported: the bytes a worker holding the
   previous version fetches per version (mean over the steps after the first: the delta, or
   the full snapshot where the delta would be over ``max_delta_fraction`` of the dense size,
   as for an adapter whose every value moves each AdamW step), the dense bf16 size of what is
   published, the step time, and LoRA's bytes as a share of full fine-tuning's (goal: <= 1%). Learning rates: the model's
   usual full fine-tuning lr and 10x for LoRA (LoRA's usual ratio); a larger lr changes more
   of the full model's bf16 values, so the full delta (the denominator) grows with it.
2. **Learning.** The quickstart's synchronous GRPO loop (bench/sync_loop.py: sample 64 x 8
   with the policy, one trainer step) from the same warm model, once with full fine-tuning and
   once with LoRA, the same number of steps: held-out greedy accuracy at the start and every
   ``--every`` steps, and the gap at the end.

Prints markdown; nothing here gates CI. Timing noise on shared 2-core machines is large:
compare step times within one invocation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.lib.models import tiny_model

LORA = {"r": 8, "alpha": 16.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
# model -> (full fine-tuning lr, batch: prompts x samples, token id range, steps)
MODELS = {"tiny": (3e-4, (16, 8), (3, 17), 6), "smollm2-135m": (1e-5, (4, 4), (3, 49000), 4)}


def model_path(name: str, tmp: Path) -> Path:
    if name == "tiny":
        return tiny_model(tmp, name="tiny")
    from astraflow.models.source import resolve

    return Path(resolve("smollm2-135m-instruct"))


def publish_run(name: str, path: Path, lora: dict[str, Any] | None, tmp: Path
                ) -> dict[str, float]:
    """RL steps of one trainer; every version published. Returns the measurements."""
    from astraflow.consumers.trainer.build import build_train_state
    from astraflow.consumers.trainer.config import TrainerConfig
    from astraflow.consumers.trainer.rl import rl_step
    from astraflow.core.bus import connect
    from astraflow.weights.publisher import Publisher
    from astraflow.weights.store import FileStore
    from bench.lib.batches import random_batch

    lr, (groups, size), vocab, steps = MODELS[name]
    tag = "lora" if lora else "full"
    cfg = TrainerConfig(device="cpu", optimizer={"lr": lr * (10 if lora else 1)}, lora=lora,
                        micro_batch_tokens=4096)
    t0 = time.perf_counter()
    state = build_train_state(cfg, path)
    load_s = time.perf_counter() - t0
    bus = connect(f"embedded://{tmp}/{name}-{tag}.db")
    pub = Publisher(bus, run="bench", policy=f"{name}-{tag}", store=FileStore(tmp / "w"),
                    background=False, full_every=10_000)
    pub.adapter = state.adapter  # as build_trainer does
    pub.publish(state.state_tensors(), 0)
    full_bytes = pub.last_manifests[0].total_bytes
    deltas, step_s, kinds = [], [], set()
    for v in range(steps):
        batch = random_batch(v, groups=groups, group_size=size, vocab=vocab)
        t = time.perf_counter()
        rl_step(state, batch, v)
        step_s.append(time.perf_counter() - t)
        pub.publish(state.state_tensors(), v + 1)
        # what a worker holding the previous version fetches: the delta, or the full snapshot
        # where the delta would exceed max_delta_fraction of the dense size (Publisher)
        m = min(pub.last_manifests, key=lambda m: m.total_bytes)
        assert (m.adapter is not None) == (lora is not None)
        deltas.append(m.total_bytes)
        kinds.add(m.kind)
    pub.close()
    bus.close()
    trainable = sum(p.numel() for p in state.model.parameters() if p.requires_grad)
    return {"delta": statistics.mean(deltas[1:]), "full": full_bytes,
            "step_s": statistics.median(step_s), "trainable": trainable, "load_s": load_s,
            "dense": pub.stats.dense_bytes / max(1, pub.stats.versions),
            "kinds": "+".join(sorted(kinds))}


def part_bytes(models: list[str]) -> None:
    print("## Bytes per published version: LoRA vs full fine-tuning\n")
    print(f"LoRA: r={LORA['r']} alpha={LORA['alpha']} on {', '.join(LORA['target_modules'])};"
          " bf16 on the wire; delta = mean over the versions after the first\n")
    print("| model | trainer | lr | trainable params | dense bf16 B | bytes / version "
          "| blobs | step s (median) | LoRA / full bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in models:
            path = model_path(name, tmp)
            full = publish_run(name, path, None, tmp)
            lora = publish_run(name, path, LORA, tmp)
            lr = MODELS[name][0]
            ratio = lora["delta"] / full["delta"]
            for tag, r, rlr in (("full", full, lr), ("lora", lora, 10 * lr)):
                share = f"**{ratio:.2%}**" if tag == "lora" else ""
                print(f"| {name} | {tag} | {rlr:g} | {r['trainable']:,.0f} | {r['dense']:,.0f} "
                      f"| {r['delta']:,.0f} | {r['kinds']} | {r['step_s']:.3f} | {share} |",
                      flush=True)


def part_learn(source: Path, steps: int, every: int, lora_lr: float | None,
               arms: list[str]) -> None:
    from astraflow.config import load_experiment
    from astraflow.run.launch import RL_CONFIG
    from bench.sync_loop import run_sync

    base_lr = load_experiment(source / RL_CONFIG).trainer.optimizer.lr
    lr = lora_lr or 10 * base_lr
    print(f"## Learning: {steps} GRPO steps from the same warm model ({source})\n")
    curves = {}
    for tag, trainer in (("full", None), ("lora", {"lora": LORA, "optimizer": {"lr": lr}})):
        if tag not in arms:
            continue
        t0 = time.perf_counter()
        curves[tag] = run_sync(source, seconds=1e9, max_steps=steps, every=every,
                               trainer=trainer,
                               log=lambda s, tag=tag: print(f"  {tag}: {s}", flush=True))
        curves[tag][-1]["wall_s"] = time.perf_counter() - t0
    print(f"\nLoRA: r={LORA['r']} alpha={LORA['alpha']} on {', '.join(LORA['target_modules'])}"
          f", lr {lr:g} (full: {base_lr:g})\n")
    print("| step | " + " | ".join(f"{t} accuracy" for t in curves) + " |")
    print("|---|" + "---|" * len(curves))
    for points in zip(*curves.values(), strict=True):
        print(f"| {points[0]['step']:.0f} | "
              + " | ".join(f"{p['eval_accuracy']:.3f}" for p in points) + " |")
    if len(curves) == 2:
        fa, la = curves["full"][-1]["eval_accuracy"], curves["lora"][-1]["eval_accuracy"]
        print(f"\nafter {steps} steps: full {fa:.3f}, LoRA {la:.3f} (LoRA - full = "
              f"{la - fa:+.3f}); start {curves['full'][0]['eval_accuracy']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="part", required=True)
    b = sub.add_parser("bytes")
    b.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ln = sub.add_parser("learn")
    ln.add_argument("source", type=Path, help="a run directory whose warm-up ended")
    ln.add_argument("--steps", type=int, default=100)
    ln.add_argument("--every", type=int, default=25)
    ln.add_argument("--lora-lr", type=float, default=None, help="default: 10x the config's")
    ln.add_argument("--arms", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    if args.part == "bytes":
        part_bytes(args.models)
    else:
        part_learn(args.source, args.steps, args.every, args.lora_lr, args.arms)


if __name__ == "__main__":
    main()
